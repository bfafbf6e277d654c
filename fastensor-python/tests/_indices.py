"""Random indices for slices (hypothesis strategies), shared by the slice tests."""

from __future__ import annotations

from hypothesis import strategies as st

#: Bounds and steps past any dimension: clamped, or overflowing torch's arithmetic.
HUGE = [2**62, 2**63 - 1, 2**63, 2**64, 2**70]


def _bound(size: int):
    return st.one_of(
        st.none(), st.integers(-2 * size - 2, 2 * size + 2), st.sampled_from(HUGE + [-(2**64)])
    )


@st.composite
def indices(draw, shape):
    """A random index for ``shape``: integers (in and out of range), slices (bounds in and
    out of range or huge, steps small, huge or not positive), None and an ellipsis,
    sometimes more parts than dimensions."""
    parts = []
    for size in list(shape)[: draw(st.integers(0, len(shape) + 1))] + [1]:
        kind = draw(st.sampled_from(["int", "slice", "slice", "none", "ellipsis"]))
        if kind == "int":
            parts.append(draw(st.integers(-size - 2, size + 2)))
        elif kind == "slice":
            step = draw(st.one_of(st.none(), st.integers(1, 4), st.sampled_from(HUGE + [0, -1])))
            parts.append(slice(draw(_bound(size)), draw(_bound(size)), step))
        elif kind == "none":
            parts.append(None)
        else:
            parts.append(...)
    parts = parts[: draw(st.integers(0, len(parts)))]
    return parts[0] if len(parts) == 1 and draw(st.booleans()) else tuple(parts)
