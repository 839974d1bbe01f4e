"""Each setting is declared once: a protocol's in its constructor's signature, a backend's in
its registry entry. Every registered one reaches what it configures from its flag, through
the run's config.toml and back, with a value other than its default."""

from __future__ import annotations

from typing import Annotated, Any

import pytest

import secagg.protocols  # noqa: F401  (registers the built-in protocols)
from secagg.backends import BACKENDS
from secagg.options import Flag, Option, options_of
from secagg.protocols.base import Protocol
from secagg.protocols.registry import PROTOCOLS, make_protocol
from secagg.runspec import settings as S
from secagg.simulation.cli import build_parser


def other_value(option: Option) -> Any:
    """A valid value that is not the default, so a setting that is dropped on the way shows."""
    if option.choices:
        return next(c for c in option.choices if c != option.default)
    if option.type is bool:
        return not option.default
    if option.type is int:
        return option.default + 1
    return option.default / 2 if option.default else 0.25


def flag_argv(option: Option, value: Any) -> list[str]:
    if option.type is bool:
        return [f"--{option.flag}" if value else f"--no-{option.flag}"]
    return [f"--{option.flag}", str(value)]


def resolved(argv: list[str], tmp_path):
    """The configuration ``secagg run ARGV`` gives, read back from the TOML it writes."""
    values = S.flag_values(build_parser().parse_args(["run", *argv]))
    config, _ = S.to_config(values)
    file = tmp_path / "config.toml"
    file.write_text(S.to_toml(S.from_config(config)))
    again, _ = S.to_config(S.read_file(file))
    return again


PROTOCOL_OPTIONS = [(name, o) for name, spec in PROTOCOLS.items() for o in spec.options]
BACKEND_OPTIONS = [(name, o) for name, spec in BACKENDS.items() for o in spec.options]


def test_there_are_options_to_check():
    assert len(PROTOCOL_OPTIONS) >= 30 and len(BACKEND_OPTIONS) >= 10


@pytest.mark.parametrize(
    "protocol,option", PROTOCOL_OPTIONS, ids=[f"{p}-{o.key}" for p, o in PROTOCOL_OPTIONS]
)
def test_every_protocol_setting_reaches_its_protocol(protocol, option, tmp_path):
    value = other_value(option)
    # on a task the protocol can train (its example's; the default task otherwise)
    task = PROTOCOLS[protocol].example.settings.get("task")
    on = ["--task", task] if task else []
    config = resolved(["--protocol", protocol, *on, *flag_argv(option, value)], tmp_path)
    built = make_protocol(protocol, **config.protocol_options)
    assert built.option_values()[option.key] == value
    # and the default is the constructor's own
    assert make_protocol(protocol).option_values()[option.key] == option.default


@pytest.mark.parametrize(
    "backend,option", BACKEND_OPTIONS, ids=[f"{b}-{o.key}" for b, o in BACKEND_OPTIONS]
)
def test_every_backend_setting_reaches_its_backend(backend, option, tmp_path):
    value = other_value(option)
    # per-round participation needs client-level DP, which then covers the run; a count of
    # groups needs participation by groups (and at least two)
    extra = {
        "participation": ("per-round", ["--client-dp", "clip=1,noise=1"]),
        "participation_groups": (2, ["--participation", "groups"]),
    }
    value, more = extra.get(option.key, (value, []))
    config = resolved(["--backend", backend, *flag_argv(option, value), *more], tmp_path)
    assert config.resolved_backend_options()[option.key] == value


class Declared(Protocol):
    name = "declared"

    def __init__(
        self,
        *,
        q: Annotated[float, Flag("declared-q", "a temperature")] = 2,
        mode: Annotated[str, Flag("declared-mode", "how", choices=("a", "b"))] = "a",
        free: int = 3,
    ):
        self.q, self.mode, self.free = q, mode, free

    def aggregate(self, ctx, uploads):  # pragma: no cover - never run
        raise NotImplementedError


def test_a_constructor_declares_its_options_with_their_types_and_defaults():
    assert Declared.options == (
        Option("q", "declared-q", float, 2, "a temperature"),
        Option("mode", "declared-mode", str, "a", "how", ("a", "b")),
    )
    assert Declared(q=5.0).option_values() == {"q": 5.0, "mode": "a"}  # `free` has no flag


def test_a_flagged_setting_without_a_default_or_with_one_of_another_type_is_refused():
    def no_default(self, q: Annotated[float, Flag("x-q", "q")]): ...

    def wrong_type(self, q: Annotated[int, Flag("x-q", "q")] = 0.5): ...

    def bool_for_int(self, q: Annotated[int, Flag("x-q", "q")] = True): ...

    for init, message in (
        (no_default, "needs a default"),
        (wrong_type, "not a int"),
        (bool_for_int, "not a int"),
    ):
        with pytest.raises(TypeError, match=message):
            options_of(init)
