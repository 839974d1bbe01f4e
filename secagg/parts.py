"""Model parts: a round moved a slice of the model at a time, so that no party holds a whole
model's sum (``part_values`` in a run's settings; 0, the default, moves the model whole).

A round in parts, on a streaming run (weights planned before the uploads):

1. the model W goes out a part at a time (``model_part``; a client assembles it and trains
   once, from the whole);
2. part 0 of each client's pseudo-gradient comes back with its ``train`` reply, part p ≥ 1
   with an ``upload_part`` reply: each part is an upload of its own (its own seeds or
   one-time key), tagged with a basis that names the part;
3. the server folds each part's uploads into a part-sized running sum, has it released and
   steps the optimizer on that slice of W (every server optimizer here is elementwise), then
   moves to the next part.

The server then holds the model, one part's running sum and one part's release at a time:
at 1e8 parameters the model's 8 bytes a parameter and a few bytes a parameter of one part,
where a whole-model round held about 45.

**Invariant (the client enforces it, from its own provisioning).** Every coordinate of a
client's update leaves it in exactly one upload a round, and so enters at most one release:
the parts' bounds come from the client's own ``part_values`` (:func:`part_bounds`), never
from a request, which only names a part's index; a client uploads each index at most once a
round, and only after it trained that round (a part's planned weight is not held equal to
part 0's: the parts are other coordinates, so another weight opens nothing more). A release
is consented to only over uploads of the same basis (the same round, part and model), so
two parts never mix, and every reveal is one part long (the provisioned lengths,
:func:`part_lengths`). A server that asks for a part twice, for an index outside the model,
or for a part of a round the client did not train in is refused before anything is made.
"""

from __future__ import annotations

from secagg.errors import ConfigError

#: the request field that names a part (a config ``{"index": p}``)
PART_FIELD = "part"


def check_part_values(part_values: object) -> int:
    """``part_values`` as a count (0: the model whole), or ConfigError saying what to set."""
    if not isinstance(part_values, int) or isinstance(part_values, bool) or part_values < 0:
        raise ConfigError(
            f"part_values must be a whole number of values (0: the model whole), not "
            f"{part_values!r}"
        )
    return part_values


def part_bounds(n_values: int, part_values: int) -> list[tuple[int, int]]:
    """The parts of a model of ``n_values`` values: consecutive [lo, hi) slices of
    ``part_values`` values each, the last one shorter; one part when ``part_values`` is 0 or
    at least the model."""
    check_part_values(part_values)
    if n_values < 1:
        raise ConfigError(f"a model of {n_values} values has no parts")
    step = part_values if 0 < part_values < n_values else n_values
    return [(lo, min(lo + step, n_values)) for lo in range(0, n_values, step)]


def part_lengths(n_values: int, part_values: int) -> tuple[int, ...]:
    """The distinct lengths of the parts (what a client's reveals may be, in this order)."""
    return tuple(dict.fromkeys(hi - lo for lo, hi in part_bounds(n_values, part_values)))


def in_parts(n_values: int, part_values: int) -> bool:
    """Whether a model of ``n_values`` values moves in more than one part."""
    return len(part_bounds(n_values, part_values)) > 1
