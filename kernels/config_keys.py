"""Where each `--config KEY=VALUE` goes: the one router of configuration keys to a workload's configuration
classes (kernels/*.py Config dataclasses), for a workload of one configuration and for one of several parts
(tp-mlp: ag., rs. and swiglu.)."""

from __future__ import annotations

from dataclasses import fields


def route(workload: str, parts: dict[str, type], overrides: dict | None) -> dict[str, dict]:
    """Overrides -> {part: {field: value}} over `parts` ({part: Config class}; one part named "" for a workload
    of one configuration). With several parts "PART.KEY" goes to that part alone and a plain KEY to every part
    whose configuration has it (so block_m=16 tiles both of tp-mlp's GEMMs; a part's own key wins over a plain
    one). A key no part knows is a one-line ValueError naming the keys there are."""
    out: dict[str, dict] = {part: {} for part in parts}
    names = {part: {f.name for f in fields(cls)} for part, cls in parts.items()}
    several = len(parts) > 1 or "" not in parts
    items = sorted((overrides or {}).items(), key=lambda kv: "." in kv[0])  # plain keys first: dotted ones win
    for key, value in items:
        part, dot, name = key.partition(".")
        if dot and several:
            if part not in parts or name not in names[part]:
                raise ValueError(f"{workload} has no configuration key {key!r} (parts: {', '.join(parts)})")
            out[part][name] = value
            continue
        owners = [p for p in parts if key in names[p]]
        if not owners:
            if several:
                raise ValueError(f"{workload} has no configuration key {key!r} (keys of its parts "
                                 f"{', '.join(parts)}, optionally as {', '.join(p + '.KEY' for p in parts)})")
            raise ValueError(f"{workload} has no configuration key {key!r} (keys: {', '.join(sorted(names['']))})")
        for p in owners:
            out[p][key] = value
    return out
