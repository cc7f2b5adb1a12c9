"""A sweep of one dimension (`taxes model --sweep`) as a table (terminal, Markdown) and a chart: each
value's E2E per variant, the eager bulk-synchronous variant's taxes, and the best fused variant's."""

from __future__ import annotations


def sweep_rows(dim, values, preds) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per value of the dimension."""
    from taxes.model.predict import TAXES

    variants = [p.variant for p in preds[0]]
    bsp, fused = sweep_kinds(preds)
    header = [dim] + [f"{v} E2E" for v in variants]
    if bsp:
        header += [f"{bsp} {t}" for t in TAXES]
    if fused:
        header += ["best fused", "best fused bulk-sync + locality", "best fused of the floor"]
    if bsp and fused:
        header += [f"{bsp} / best fused"]
    rows = []
    for value, ps in zip(values, preds):
        by = {p.variant: p for p in ps}
        row = [str(value)] + [f"{by[v].e2e_us:,.1f}" for v in variants]
        if bsp:
            row += [f"{x:,.1f}" for x in by[bsp].taxes_us().values()]
        if fused:
            best = min((by[v] for v in fused), key=lambda p: p.e2e_us)
            t = best.taxes_us()
            row += [best.variant, f"{t['bulk-synchronous'] + t['data-locality']:,.1f}",
                    f"{best.floor.ideal_us / best.e2e_us:.2f}"]
            if bsp:
                row += [f"{by[bsp].e2e_us / best.e2e_us:.2f}x"]
        rows.append(row)
    return header, rows


def sweep_kinds(preds) -> tuple[str | None, list[str]]:
    """The eager bulk-synchronous variant (bsp; all-bsp for tp-mlp) and the fused ones, read from the
    variants table rather than from their names."""
    from taxes import variants as variant_table

    w = preds[0][0].workload.name
    kinds = {p.variant: variant_table.modelled(w, p.variant) for p in preds[0]}
    bsp = next((v for v, k in kinds.items() if k.rung == "bsp" and not k.graphed), None)
    return bsp, [v for v, k in kinds.items() if k.fused]


def sweep_terminal(dim, values, preds, console):
    from taxes.console import print_table
    from taxes.reports.plots import case_title
    from taxes.workloads import workload_dict

    w = preds[0][0].workload
    header, rows = sweep_rows(dim, values, preds)
    print_table(console, f"sweep of {dim}: " + case_title(workload_dict(w)), header, rows)


def sweep_markdown(dim, values, preds) -> str:
    from taxes.reports.markdown_table import md_table

    return md_table(*sweep_rows(dim, values, preds)) + "\n"


def sweep_chart(dim, values, preds, fmt: str = "png") -> bytes:
    from taxes.reports.plots import case_title, sweep_lines
    from taxes.workloads import workload_dict

    e2e: dict[str, list[float]] = {}
    for ps in preds:
        for p in ps:
            e2e.setdefault(p.variant, []).append(p.e2e_us)
    bsp, fused = sweep_kinds(preds)
    best = [min((p for p in ps if p.variant in fused), key=lambda p: p.e2e_us) for ps in preds] if fused else []
    taxes_by: dict[str, dict[str, list[float]]] = {}
    if bsp:
        for ps in preds:
            for tax, val in next(p for p in ps if p.variant == bsp).taxes_us().items():
                taxes_by.setdefault(bsp, {}).setdefault(tax, []).append(val)
    for p in best:
        for tax, val in p.taxes_us().items():
            taxes_by.setdefault("best fused", {}).setdefault(tax, []).append(val)
    ratio = [e / b.e2e_us for e, b in zip(e2e[bsp], best)] if bsp and best else None
    of_floor = [b.floor.ideal_us / b.e2e_us for b in best] or None
    w = preds[0][0].workload
    return sweep_lines(dim, values, e2e, taxes_by, ratio, f"predicted, sweep of {dim}: {case_title(workload_dict(w))}",
                       fmt, of_floor)
