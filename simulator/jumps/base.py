"""The fast-forward base class and its stages (see the package's docstring for the claims they make)."""

from __future__ import annotations

STAGES = ("before", "answer", "after")


class Jump:
    """One fast-forward. `make` says whether it can apply to a plan at all (an instance, or None);
    `try_jump` takes steps if its claim holds now and returns how many, else None."""

    name = ""
    stage = ""
    one_take = False  # an "answer" fast-forward whose claim is about answers of one prefill take only
    untimed = False   # its claim needs a plan without a clock (no arrival can come between its steps)

    @classmethod
    def make(cls, st) -> Jump | None:
        return None if cls.untimed and st.timed else cls()

    def try_jump(self, st, arg) -> int | None:  # pragma: no cover - every fast-forward defines it
        raise NotImplementedError
