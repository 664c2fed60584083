"""Export every zoo model (static and dynamic) and print, as Markdown, what pnnx emitted:
operator types per model, every parameter / weight / input key per operator type (with the values
seen when there are few), one verbatim example line per type, and every distinct pnnx.Expression.

    python tests/zoo/inventory.py > tests/zoo/INVENTORY.md
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests.zoo` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.zoo import list_specs  # noqa: E402
from tests.zoo.export import export, zoo_hash  # noqa: E402

MAX_VALUES = 12

QUIRKS = """\
## pnnx quirks seen in these exports (checked by hand against the files; keep up to date)

- **BatchNorm never appears**: a BN after a conv is folded into an `nn.Conv2d` renamed
  `convbn2d_N` with `bias=True` and a `@bias` even if the torch conv had none; such a folded conv
  also carries `$input=`, a plain module conv does not. A conv/linear with `bias=False` has no
  `@bias` (YOLOv8's DFL conv, the decoder's linears).
- **Modules vs functions**: a module call keeps its class name (`nn.ReLU`, `nn.SiLU`, `nn.Sigmoid`)
  and is named after its module path (`features.1.block.1.scale_activation`); a functional call
  becomes `F.x` / `torch.x` / `Tensor.x`, usually with `$input=` (`torch.split` says `$tensor=`,
  `torch.matmul` `$input`/`$other`, SDPA `$query`/`$key`/`$value`, `Tensor.expand`
  `$input`/`$sizes`). A module called several times (SPPF's max pool) gives one op per call:
  `b9.m`, `pnnx_unique_0`, `pnnx_unique_1`.
- **No SiLU fusion here**: `torch.sigmoid(x) * x` stays `F.sigmoid` + `pnnx.Expression mul(@0,@1)`
  (residual_branches); squeeze-excitation gives `nn.Sigmoid`/`nn.Hardsigmoid` + `mul(@0,@1)`.
  `F.silu` appears only where torch called F.silu.
- **Fusions that do happen**: ShuffleNet's view/transpose/view channel shuffle becomes
  `nn.ChannelShuffle groups=2`; dropout and identity vanish; consecutive elementwise ops merge into
  one `pnnx.Expression` (`sub(add(@0,mul(@1,0.5)),@2)`), Python scalars become literals
  (`mul(@0,0.125)` for `q * head_dim**-0.5`, `mul(add(mul(@0,2),@1),8.0)` for YOLOv5's
  `(xy*2+grid)*stride`). Explicit timm attention is *not* fused into `nn.MultiheadAttention`: it
  stays `torch.unbind` (1 in, 3 out), `torch.transpose`, `torch.matmul`, `F.softmax`.
- **Static exports fold batch-1 shape work**: `class_token.expand(1,-1,-1)` disappears and
  `pos_embeddings[:, :T]` becomes a new `pnnx.Attribute pnnx_fold_N`; in the dynamic export they
  stay `Tensor.expand` (fed by `pnnx.Expression [size(@0,0),-1,-1]`) and `Tensor.slice dim=1
  start=0 end=16 step=1` on the full (1,32,64) attribute. So static and dynamic graphs of one model
  can differ in op types (listed per model above).
- **Reshape spelling**: static `Tensor.reshape shape=(1,197,3,3,64) $input=9`; dynamic
  `shape=(-1,197,3,3,64)` and no `$input`. `x.view(...)` is exported as `Tensor.reshape`.
- **List-valued expression**: `[size(@0,0),-1,-1]` has no `#` shape for its output operand (it is a
  shape list, not a tensor); it feeds `Tensor.expand`'s `$sizes`.
- **Attributes**: `pnnx.Attribute` has one weight `@data`; its .bin member is `<op name>.data`. Names
  are the parameter path (`pos_embed`, `class_token`, `pos_embeddings`), or `<module>` /
  `pnnx_unique_N` when one module holds several buffers (YOLOv5 grids: `detect`,
  `pnnx_unique_2..6`), or `pnnx_fold_N` for folded constants. Their shapes keep a leading 1 even
  in dynamic exports: `(1,3,80,80,2)` is broadcast against `(?,3,80,80,2)`.
- **Weight names with dots**: `nn.MultiheadAttention` has `@in_proj_weight` (3E,E),
  `@in_proj_bias`, `@out_proj.weight`, `@out_proj.bias`; .bin members are
  `encoder.layers.0.self_attention.out_proj.weight`, so split a member name at the op name, not at
  the last dot. The op has one input (self-attention called as `(x, x, x)`) and, with
  `need_weights=False`, one output.
- **Number spellings**: eps `1.000000e-6` (LayerNorm), `1.000000e-5` (RMSNorm); scale factors
  `(2.0,2.0)`; SDPA `dropout_p=0.0`; `attn_mask=None`; a one-element tuple is `(768)`.
- **Interpolation**: `F.interpolate(..., mode="bilinear")` is exported as `F.upsample` with
  `align_corners=True|False mode=bilinear scale_factor=(2.0,2.0)` and no `size` key;
  `nn.Upsample(None, 2, "nearest")` keeps `nn.Upsample mode=nearest scale_factor=(2.0,2.0)
  size=None`.
- **Multi-output ops**: `torch.chunk chunks=2 dim=1` (1->2), `torch.split
  split_size_or_sections=(2,2,81) dim=4` (1->3), `torch.unbind dim=0` (1->3). Models with several
  outputs end in `prim::TupleConstruct` (n->1, no shape on its output) and one `pnnx.Output` with
  no shape.
- **Integer input**: the decoder's token input is `#0=(1,16)i64` and feeds `nn.Embedding`
  (`@weight=(512,64)f32`).
- **ConvTranspose2d**: weight `(in, out/groups, kh, kw)` = `(256,128,2,2)`, `output_padding=(0,0)`,
  no `$input`.
- Not seen in this zoo (but listed in shared/PNNX.md): `nn.BatchNorm2d`, `F.gelu`, `torch.clamp`,
  `F.max_pool2d`, `F.avg_pool2d`, `torch.sum`, `torch.max`, `torch.squeeze`, `nn.Softmax`,
  `F.log_softmax`, `F.upsample_nearest`, `F.leaky_relu`, `F.tanh`, and the second
  `Tensor.slice` form (`dims/starts/ends/steps/selects`).
"""  # list the distinct values of a key when there are at most this many


def parse_line(line: str) -> dict:
    tok = line.split()
    typ, name, n_in, n_out = tok[0], tok[1], int(tok[2]), int(tok[3])
    ins = tok[4 : 4 + n_in]
    outs = tok[4 + n_in : 4 + n_in + n_out]
    params, weights, inputs, shapes = {}, {}, {}, {}
    for kv in tok[4 + n_in + n_out :]:
        k, _, v = kv.partition("=")
        if k.startswith("@"):
            weights[k[1:]] = v
        elif k.startswith("$"):
            inputs[k[1:]] = v
        elif k.startswith("#"):
            shapes[k[1:]] = v
        else:
            params[k] = v
    return dict(
        type=typ,
        name=name,
        ins=ins,
        outs=outs,
        params=params,
        weights=weights,
        inputs=inputs,
        shapes=shapes,
    )


def read_param(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert lines[0].strip() == "7767517", path
    n_ops, _ = map(int, lines[1].split())
    ops = [parse_line(ln) | {"line": ln} for ln in lines[2:] if ln.strip()]
    assert len(ops) == n_ops, (path, len(ops), n_ops)
    return ops


def shorten(line: str) -> str:
    """Collapse the runs of spaces pnnx pads the first columns with (content unchanged)."""
    return " ".join(line.split())


def main() -> int:
    specs = list_specs()
    per_model: dict[str, Counter] = {}
    per_model_dyn: dict[str, Counter] = {}
    timings = []
    # op type -> info
    keys: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    wkeys: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    ikeys: dict[str, set] = defaultdict(set)
    arity: dict[str, set] = defaultdict(set)
    used_by: dict[str, set] = defaultdict(set)
    exprs: dict[str, set] = defaultdict(set)
    dyn_notes: dict[str, list[str]] = defaultdict(list)
    dtypes: set[str] = set()

    for spec in specs:
        variants = [False] + ([True] if spec.dynamic_batch is not None else [])
        for dynamic in variants:
            param = export(spec, dynamic)
            meta = json.loads((param.parent / "meta.json").read_text())
            bin_mb = (param.parent / f"{spec.name}.pnnx.bin").stat().st_size / 2**20
            timings.append(
                (
                    spec.name,
                    dynamic,
                    meta["export_seconds"],
                    meta["trace_seconds"],
                    meta["pnnx_seconds"],
                    bin_mb,
                    meta.get("trace_cpu_seconds", float("nan"))
                    + meta.get("pnnx_cpu_seconds", float("nan")),
                    meta.get("load_average", [float("nan")])[0],
                )
            )
            ops = read_param(param)
            (per_model_dyn if dynamic else per_model)[spec.name] = Counter(o["type"] for o in ops)
            tag = f"{spec.name}{' (dyn)' if dynamic else ''}"
            for o in ops:
                t = o["type"]
                used_by[t].add(spec.name)
                arity[t].add(f"{len(o['ins'])}->{len(o['outs'])}")
                for k, v in o["params"].items():
                    keys[t][k].add(v)
                for k, v in o["weights"].items():
                    wkeys[t][k].add(v[v.index(")") + 1 :] if ")" in v else v)
                ikeys[t].update(o["inputs"])
                dtypes.update(v[v.rindex(")") + 1 :] for v in o["shapes"].values())
                if t == "pnnx.Expression":
                    exprs[o["params"]["expr"]].add(tag)
                if dynamic:
                    p = o["params"]
                    if (
                        t == "pnnx.Expression"
                        and ("size(" in p["expr"] or p["expr"].startswith("["))
                    ) or (
                        t in ("Tensor.reshape", "Tensor.view", "Tensor.expand")
                        and ("shape" in p or o["inputs"])
                    ):
                        dyn_notes[spec.name].append(shorten(o["line"]))

    # choose, per type, the example line with the most parameter keys (then the shortest)
    best: dict[str, str] = {}
    for spec in specs:
        for dynamic in [False, True] if spec.dynamic_batch is not None else [False]:
            for o in read_param(export(spec, dynamic)):
                t = o["type"]
                score = (
                    len(o["params"]) + len(o["weights"]) + len(o["inputs"]),
                    -len(o["line"]),
                    not dynamic,
                )
                if t not in best or score > best[t][0]:
                    best[t] = (score, o["line"])

    w = print
    w("# pnnx operator inventory of the test zoo")
    w()
    w(
        "Generated by `python tests/zoo/inventory.py > tests/zoo/INVENTORY.md` (do not edit by hand)."
    )
    from tests.zoo.export import _versions

    v = _versions()
    w(f"torch {v['torch']}, pnnx {v['pnnx']}, zoo hash `{zoo_hash()}`. Static exports use batch 1;")
    w(
        "dynamic ones add `inputs2` with the model's `dynamic_batch` (4, or 2 for the big ones), so the"
    )
    w("batch dimension reads `?`. Types and keys are the union over static and dynamic exports.")
    w()
    w("Key roles (see shared/PNNX.md): `@k` weight in the .bin as `<op name>.<k>`, `$k` names an")
    w("input operand, `#operand` its shape; the rest are parameters, listed below.")
    w()

    w(
        "Operand dtypes seen (`#` shapes): "
        + ", ".join(f"`{x}`" for x in sorted(dtypes))
        + "; weight dtypes (`@`): "
        + ", ".join(
            f"`{x}`" for x in sorted({d for t in wkeys for ds in wkeys[t].values() for d in ds})
        )
        + "."
    )
    w()
    w(QUIRKS)
    w("## Export timings (this machine: 2 cores)")
    w()
    w(
        "Wall seconds depend on what else runs; CPU seconds (trace in-process + the pnnx child) do not"
    )
    w("much. `load` is the 1-minute load average when the export finished (2 cores).")
    w()
    w("| model | variant | export s | trace s | pnnx s | CPU s | load | .pnnx.bin MiB |")
    w("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, dyn, t, tt, tp, mb, cpu, load in timings:
        w(
            f"| {name} | {'dynamic' if dyn else 'static'} | {t:.1f} | {tt:.1f} | {tp:.1f} | {cpu:.1f} | {load:.1f} | {mb:.1f} |"
        )
    tot_s = sum(t for n, d, t, *_ in timings if not d)
    tot_d = sum(t for n, d, t, *_ in timings if d)
    cpu_s = sum(x[6] for x in timings)
    w(
        f"| **total** | static {tot_s:.0f} s, dynamic {tot_d:.0f} s | {tot_s + tot_d:.0f} | | |"
        f" {cpu_s:.0f} | | |"
    )
    w()

    all_types = sorted(used_by, key=lambda t: (t.split(".")[0] not in ("pnnx",), t))
    w("## Operator types per model (static export; counts)")
    w()
    for spec in specs:
        c = per_model[spec.name]
        w(
            f"- **{spec.name}** ({sum(c.values())} ops): "
            + ", ".join(f"`{t}` {n}" for t, n in sorted(c.items(), key=lambda x: (-x[1], x[0])))
        )
        if spec.name in per_model_dyn and per_model_dyn[spec.name] != c:
            d = per_model_dyn[spec.name]
            diff = {
                t: (c.get(t, 0), d.get(t, 0)) for t in set(c) | set(d) if c.get(t, 0) != d.get(t, 0)
            }
            w(
                "  - dynamic export differs: "
                + ", ".join(f"`{t}` {a} -> {b}" for t, (a, b) in sorted(diff.items()))
            )
    w()

    w("## Operator types: which models use them")
    w()
    w("| type | models |")
    w("|---|---|")
    for t in all_types:
        w(f"| `{t}` | {', '.join(s.name for s in specs if s.name in used_by[t])} |")
    w()

    w(
        "## Per operator type: inputs->outputs, parameter keys (values seen), weights, input names, example"
    )
    w()
    for t in all_types:
        w(f"### `{t}`")
        w()
        w(f"- inputs->outputs: {', '.join(sorted(arity[t]))}")
        if keys[t]:
            w("- params:")
            for k in sorted(keys[t]):
                vals = sorted(keys[t][k])
                if t == "pnnx.Expression" and k == "expr":
                    w(f"  - `expr`: {len(vals)} distinct, all listed in the expression table below")
                    continue
                if len(vals) <= MAX_VALUES:
                    shown = " ".join(f"`{x}`" for x in vals)
                else:
                    shown = (
                        " ".join(f"`{x}`" for x in vals[:MAX_VALUES])
                        + f" ... ({len(vals)} distinct)"
                    )
                w(f"  - `{k}`: {shown}")
        else:
            w("- params: none")
        if wkeys[t]:
            w(
                "- weights: "
                + ", ".join(f"`@{k}` ({'/'.join(sorted(d))})" for k, d in sorted(wkeys[t].items()))
            )
        if ikeys[t]:
            w("- named inputs: " + ", ".join(f"`${k}`" for k in sorted(ikeys[t])))
        w("- example:")
        w()
        w("```")
        w(best[t][1])
        w("```")
        w()

    w("## pnnx.Expression strings (all distinct `expr=` values)")
    w()
    import re

    tokens = sorted({m for e in exprs for m in re.findall(r"[A-Za-z_]+(?=\()", e)})
    w(
        "Functions used: "
        + ", ".join(f"`{x}`" for x in tokens)
        + ". Literals seen: ints (`2`, `12`, `-1`),"
    )
    w("floats (`0.5`, `0.125`, `8.0`); a bracketed list `[...]` is a shape for a following op.")
    w()
    w("| expr | where |")
    w("|---|---|")
    for e in sorted(exprs):
        where = sorted(exprs[e])
        w(f"| `{e}` | {', '.join(where)} |")
    w()

    w("## Shape-carrying ops in the dynamic exports")
    w()
    w("Reshapes keep the other dimensions and write `-1` for the batch; where torch code took")
    w(
        "`x.shape[0]` into a size list, pnnx emits a `pnnx.Expression` with `size(@0,0)` whose output"
    )
    w("feeds the op's `$sizes`/`$shape` input.")
    w()
    for name, lines in dyn_notes.items():
        w(f"- **{name}**")
        seen = set()
        for ln in lines:
            key = (
                ln.split()[0]
                + " "
                + " ".join(
                    x for x in ln.split()[5:] if not x.startswith("#") and not x[0].isdigit()
                )
            )
            if key in seen:
                continue
            seen.add(key)
            w(f"  - `{ln}`")
    w()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
