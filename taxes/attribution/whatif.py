"""What-if, per step: the step's time if one tax were removed (labelled predicted).

    graphs   CUDA graphs remove the launch path and the host-bound time of capturable host work (Python
             between launches) from every idle gap, but leave the graph's own per-kernel gap: each gap's
             launch + host_bound part becomes at most graph_gap_us. The step's first gap (the one at its
             window's start) keeps its launch part: a replay is still launched once per step.
             Synchronisation, data loading, compilation, queued waits and gaps already inside graph
             replays stay.
    overlap  full overlap of communication with compute removes the exposed transfer (sync wait stays:
             a late peer is still late).
    fusion   fusing the listed producer -> consumer pairs removes their locality row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CHANGES = ("graphs", "overlap", "fusion")


def project(rows: pd.DataFrame, gaps: pd.DataFrame, graph_gap_us: float) -> pd.DataFrame:
    """rank, step, change, projected_us, removed_us for every (rank, step) row and change."""
    if rows.empty:
        return pd.DataFrame(columns=["rank", "step", "change", "projected_us", "removed_us"])
    removed_graph = pd.Series(0.0, index=pd.MultiIndex.from_frame(rows[["rank", "step"]]))
    if not gaps.empty:
        g = gaps[gaps["cause"].isin(("launch", "host"))]
        first = rows.set_index(["rank", "step"])["start_us"]
        at_start = np.isclose(g["start_us"].values, first.reindex(pd.MultiIndex.from_frame(g[["rank", "step"]])).values,
                              rtol=0.0, atol=1e-6)
        g = g[~(at_start & (g["cause"].values == "launch"))]  # the replay's own launch stays
        per_gap = g.groupby(["rank", "step", "start_us"])["dur_us"].sum()
        at_start = np.isclose(per_gap.index.get_level_values("start_us"),
                              first.reindex(per_gap.index.droplevel("start_us")).values, rtol=0.0, atol=1e-6)
        cut = np.where(at_start, per_gap.values, np.clip(per_gap.values - graph_gap_us, 0.0, None))
        by_step = pd.Series(cut, index=per_gap.index).groupby(level=["rank", "step"]).sum()
        removed_graph = removed_graph.add(by_step, fill_value=0.0).reindex(removed_graph.index, fill_value=0.0)
    out = []
    for change, removed in (("graphs", removed_graph.values), ("overlap", rows["exposed_transfer"].clip(lower=0).values),
                            ("fusion", rows["locality"].clip(lower=0).values)):
        out.append(pd.DataFrame({"rank": rows["rank"].values, "step": rows["step"].values, "change": change,
                                 "projected_us": rows["span_us"].values - removed, "removed_us": removed}))
    return pd.concat(out, ignore_index=True)
