"""`python -m selfattn_lite.X` and `python -m selfattn_lite.course.X`: every command line answers --help, and run bare does what `make` runs.

Each command is run in this process (``runpy``, as ``-m`` runs it) with its work function
replaced by a recorder, so no notebook, site or process is built.
"""

import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# module -> (the function its command line calls, that function's module, the arguments run bare)
COMMANDS = {
    "course.student": ("build", "selfattn_lite.course.student", ("notebooks", "student")),
    "course.assignments": ("generate", "selfattn_lite.course.assignments", ("notebooks", "assignments")),
    "course.badges": ("apply", "selfattn_lite.course.badges", ("notebooks",)),
    "course.site": ("build", "selfattn_lite.course.site", ("_site",)),
    "course.explorer_data": ("write", "selfattn_lite.course.explorer_data", (".",)),
    "course.figures": ("make_all", "selfattn_lite.course.figures", ("figures",)),
    "course.distributed_cli": ("self_check", "selfattn_lite.course.distributed_cli", (2,)),
    "course.study_time": ("report", "selfattn_lite.course.study_time", ("notebooks",)),
}


def run(module, argv, monkeypatch):
    """Run ``python -m selfattn_lite.<module> *argv`` here; return the arguments its work function got."""
    name, owner, _ = COMMANDS[module]
    calls = []
    monkeypatch.setattr(f"{owner}.{name}", lambda *args: calls.append(args) or [])
    monkeypatch.setattr(sys, "argv", [module.rsplit(".", 1)[-1], *argv])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if module == "course.figures":      # a package: its __main__ module is the command line
        runpy.run_module("selfattn_lite.course.figures", run_name="__main__")
    else:                        # the command line calls main(); the module itself stays the imported one
        __import__(owner, fromlist=["main"]).main()
    return calls


@pytest.mark.parametrize("module", list(COMMANDS))
def test_help_names_the_arguments(module, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(module, ["--help"], monkeypatch)
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: python -m selfattn_lite.{module} [-h]") and "(default:" in usage


@pytest.mark.parametrize("module", list(COMMANDS))
def test_bare_command_uses_the_defaults_and_arguments_override_them(module, monkeypatch):
    defaults = COMMANDS[module][2]
    assert run(module, [], monkeypatch) == [defaults]
    other = tuple(3 if isinstance(d, int) else f"elsewhere{i}" for i, d in enumerate(defaults))
    assert run(module, [str(x) for x in other], monkeypatch) == [other]


def test_the_makefile_passes_what_the_defaults_are():
    makefile = (ROOT / "Makefile").read_text()
    called = dict(re.findall(r"-m selfattn_lite\.([\w.]+) ?([^\n$]*)", makefile))
    for module, (_, _, defaults) in COMMANDS.items():
        if module in called:
            assert called[module].split() == [str(d) for d in defaults], module
    assert {f"course.{m}" for m in ("student", "assignments", "badges", "site", "figures")} <= set(called)


def test_a_torchrun_world_size_wins(monkeypatch):
    calls = run("course.distributed_cli", ["5"], monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(sys, "argv", ["distributed_cli"])
    from selfattn_lite.course import distributed_cli

    distributed_cli.main()
    assert calls == [(5,), (4,)]
