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

MAX_VALUES = 12  # list the distinct values of a key when there are at most this many


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
    w("## Export timings (this machine: 2 cores)")
    w()
    w("| model | variant | export s | trace s | pnnx s | .pnnx.bin MiB |")
    w("|---|---|---:|---:|---:|---:|")
    for name, dyn, t, tt, tp, mb in timings:
        w(
            f"| {name} | {'dynamic' if dyn else 'static'} | {t:.1f} | {tt:.1f} | {tp:.1f} | {mb:.1f} |"
        )
    tot_s = sum(t for n, d, t, *_ in timings if not d)
    tot_d = sum(t for n, d, t, *_ in timings if d)
    w(f"| **total** | static {tot_s:.0f} s, dynamic {tot_d:.0f} s | {tot_s + tot_d:.0f} | | | |")
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
