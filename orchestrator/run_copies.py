"""Runs a silicon file lists twice, under two ids. One export of AIConfigurator's collector names a run's layout in
its id (`..._c64_tp4_ep4_1290`) and restates it in the columns as attention-DP ranks, which
`layout_readings.named_layout` reads back as the id's; another export lists the same run under an id that names no
layout (`..._c64_cfg635`). A run whose every cell but its id is another run's is that run: read with the layout the
other's id names (`layout_id`), not as a deployment of tp x attention-DP devices (the measured MoE file: 15 runs of
Kimi-K2.5 on B200, each a copy to the last digit of a run whose id names 4 devices, read as 16 before)."""

from __future__ import annotations

from orchestrator.layout_readings import ID_LAYOUT


def with_copied_layouts(rows: list[dict]) -> list[dict]:
    """`rows` (cells as text) with `layout_id` on each run whose id names no layout and that copies a run whose id
    does: that run's id."""
    runs = [(cells, measurement(cells), bool(ID_LAYOUT.search(cells.get("id", "")))) for cells in rows]
    named: dict[tuple, str] = {}
    for cells, what, names in runs:
        if names:
            named.setdefault(what, cells["id"])
    return [dict(cells, layout_id=named[what]) if not names and what in named else cells for cells, what, names in runs]


def measurement(cells: dict) -> tuple:
    """What a run is, its id apart: every other cell (as text); two runs alike in it are one run listed twice."""
    return tuple(sorted((key, str(value)) for key, value in cells.items() if key != "id"))
