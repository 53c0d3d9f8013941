"""Measured runs that ran far fewer requests at once than their clients where we run them all: by Little's law a
closed loop of C clients keeps C x decode / (TTFT + decode) requests decoding on average, decode = (output - 1) x
TPOT, so a measured TTFT far above ours at a TPOT like ours says something ahead of the engine's steps held the
requests back (a cap on requests in flight, the client's connections, a smaller KV pool, a front end near its
streaming rate) that the run's row does not record (bench/littles_law.py finds such campaigns)."""

from __future__ import annotations

#: a run whose requests decoding on average (measured) are below this share of ours is said to be held back
HELD_BACK_SHARE = 0.7


def decoding(clients, output, ttft_ms, tpot_ms):
    """Requests decoding on average in a closed loop (Little's law): numbers or pandas columns alike."""
    decode = (output - 1) * tpot_ms
    return clients * decode / (ttft_ms + decode)


def add_running(table, measured_columns: dict, loads):
    """`table` with `measured_running` and `running` (ours) on its closed-loop rows that measured both TTFT and
    TPOT (NaN elsewhere), and `held_back` where the measured is below HELD_BACK_SHARE of ours; `loads`: each row's
    arrival, clients and output length as estimated (a frame on the table's index)."""
    import pandas as pd

    ttft, tpot = (next(m for m, (ours, _) in measured_columns.items() if ours == metric)
                  for metric in ("ttft_ms", "tpot_ms"))
    if not {ttft, tpot} <= set(table.columns):
        return table
    measured_ttft, measured_tpot = (pd.to_numeric(table[c], errors="coerce") for c in (ttft, tpot))
    closed = (loads["arrival"] == "closed") & (loads["output"] > 1)
    clients, output = loads["clients"], loads["output"]
    measured = decoding(clients, output, measured_ttft, measured_tpot).where(closed)
    ours = decoding(clients, output, table["ttft_ms"], table["tpot_ms"]).where(closed)
    return table.assign(measured_running=measured, running=ours, held_back=measured < HELD_BACK_SHARE * ours)


def held_back_note(table) -> str | None:
    """One line on the runs held back (`add_running`), naming the one held back most; None where none was."""
    if "held_back" not in table or not table["held_back"].any():
        return None
    rows = table[table["held_back"]]
    worst = (rows["measured_running"] / rows["running"]).idxmin()
    r, name = rows.loc[worst], str(rows.loc[worst].get("id", f"row {worst + 2}"))
    return (f"{len(rows)} closed-loop runs ran far fewer requests at once than we run (Little's law on their measured "
            f"TTFT and TPOT, columns measured_running and running; {name}: about {r['measured_running']:.0f} "
            f"requests decoding, where we run {r['running']:.0f}): something ahead of the "
            "engine held them back that the rows do not record (a cap on requests in flight, the client's "
            "connections, a smaller KV pool, a front end near its streaming rate), and their TTFT comes out far "
            "below the measured; calibrate on a few of them tries a cap, a smaller pool and a costlier stream")
