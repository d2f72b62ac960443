"""Output paths: every command checks every file and folder it will write
before it does any work, and refuses a bad one in one line (a folder where a
file is due, a missing folder, two outputs naming one file, an output naming
the command's input)."""

from __future__ import annotations

import pkgutil
from importlib import import_module

import pytest

import twin.cli as cli
from twin._io import AtomicFile, atomic_path, check_outputs
from twin.errors import TwinError

# A valid invocation of each command that writes files, and its output-file flags.
COMMANDS = {
    "run": (["run", "quickstart"],
            ["--json", "--requests-csv", "--requests-parquet", "--links-csv", "--trace-out",
             "--timeline-csv"]),
    "kv": (["kv", "llama-3.1-8b"], ["--json"]),
    "handoff": (["handoff", "llama-3.1-8b", "--tokens", "100", "--topology", "dgx-h100-ib400"],
                ["--json"]),
    "provision": (["provision", "disagg"], ["--json", "--export-dynamo", "--export-llm-d"]),
    "plan": (["plan", "disagg"], ["--json", "--export-dynamo", "--export-llm-d"]),
    "topo": (["topo", "dgx-h100-ib400"], ["--json", "--png"]),
    "bench": (["bench"], ["--json"]),
    "models": (["models"], ["--json"]),
    "gpus": (["gpus"], ["--json"]),
    "report": (["report", "."], ["--out"]),
    "profile": (["profile", "tiny", "--device", "cpu"], ["--out"]),
}  # fmt: skip
FILE_FLAGS = [(cmd, flag) for cmd, (_, flags) in COMMANDS.items() for flag in flags]
FOLDER_COMMANDS = {
    "sweep": ["sweep", "pool-ratio"],
    "goodput": ["goodput", "pool-ratio"],
    "plot": ["plot", "--requests", "r.csv"],
}


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """Run in an empty folder, with every command replaced by one that fails
    the test: a refused path must be found before the command starts."""
    monkeypatch.chdir(tmp_path)

    def started(args):
        raise AssertionError(f"twin {args.command} started despite a bad output path")

    for info in pkgutil.iter_modules(cli.__path__, "twin.cli."):
        module = import_module(info.name)
        for name in dir(module):
            if name.startswith("cmd_"):
                monkeypatch.setattr(module, name, started)
    return tmp_path


def _refused(capsys, argv: list[str], message: str) -> str:
    """The one error line of ``argv`` (exit 2), which names ``message``."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("twin: error: "), err
    assert message in err, err
    return err


@pytest.mark.parametrize(("cmd", "flag"), FILE_FLAGS)
@pytest.mark.parametrize(
    ("path", "why"),
    [
        (".", "'.' names a folder; expected a file name"),
        ("sub", "'sub' is a folder; expected a file name"),
        ("newdir/", "'newdir/' names a folder; expected a file name"),
        ("missing/x.out", "'missing/x.out': no folder 'missing'; create it first"),
    ],
)
def test_a_bad_output_file_is_refused_before_the_command(no_work, capsys, cmd, flag, path, why):
    (no_work / "sub").mkdir()
    argv, _ = COMMANDS[cmd]
    _refused(capsys, [*argv, flag, path], f"{flag}: {why}")
    assert sorted(p.name for p in no_work.iterdir()) == ["sub"]  # nothing written, not even 0 B


@pytest.mark.parametrize("cmd", FOLDER_COMMANDS)
def test_an_output_folder_that_is_a_file_is_refused(no_work, capsys, cmd):
    (no_work / "f").write_text("x")
    argv = FOLDER_COMMANDS[cmd]
    assert "'f' is a file" in _refused(capsys, [*argv, "--out", "f"], "expected a folder")
    assert "which is a file" in _refused(capsys, [*argv, "--out", "f/g"], "--out: 'f/g' is")


@pytest.mark.parametrize(("cmd", "flag"), [(c, f) for c, f in FILE_FLAGS if f != "--json"])
def test_two_outputs_naming_one_file_are_refused(no_work, capsys, cmd, flag):
    argv, flags = COMMANDS[cmd]
    if flags == [flag]:
        pytest.skip(f"twin {cmd} writes one file")
    first = next(f for f in flags if f != flag)
    err = _refused(
        capsys, [*argv, first, "out.x", flag, "./out.x"],
        f"{flag}: './out.x' is also {first}'s file; give each its own",
    )  # fmt: skip
    assert flag in err and first in err


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["run", "s.yaml", "--json", "s.yaml"], "SPEC"),
        (["run", "s.yaml", "--requests-csv", "./s.yaml"], "SPEC"),
        (["plan", "s.yaml", "--export-dynamo", "s.yaml"], "SPEC"),
        (["plot", "--requests", "s.yaml", "--timeline", "t.csv", "--trace", "t.csv"], None),
        (["validate", "run", "s.yaml", "--against", "r.json"], None),
        (["topo", "s.yaml", "--png", "s.yaml"], "NAME|PATH"),
        (["kv", "s.yaml", "--json", "s.yaml"], "MODEL"),
        (["calibrate", "--profile", "s.yaml", "--json"], None),
    ],
)
def test_an_output_naming_the_commands_input_is_refused(no_work, capsys, argv, what):
    (no_work / "s.yaml").write_text("name: s\n")
    (no_work / "t.csv").write_text("t\n")
    (no_work / "r.json").write_text("{}\n")
    if what is None:  # inputs only: no output to refuse, the command runs
        with pytest.raises(AssertionError, match="started despite"):
            cli.main(argv)
        return
    flag = next(a for a in argv if a.startswith("--"))
    _refused(capsys, argv, f"{flag}: '{argv[-1]}' is the input {what}; an output cannot be it")
    assert (no_work / "s.yaml").read_text() == "name: s\n"


def test_json_to_stdout_and_outputs_in_existing_folders_pass(no_work):
    (no_work / "sub").mkdir()
    check_outputs([("--json", "-"), ("--json", None), ("--a", "sub/a.csv"), ("--b", "b.csv")],
                  [("--out", "new/deeper"), ("--out", "sub")])  # fmt: skip
    assert sorted(p.name for p in no_work.rglob("*")) == ["sub"]


def test_the_writers_refuse_a_folder_in_one_line(tmp_path):
    for path in (str(tmp_path), f"{tmp_path}/", f"{tmp_path}/newdir/"):
        with pytest.raises(TwinError, match="folder; expected a file name"):
            AtomicFile(path)
        with pytest.raises(TwinError, match="folder; expected a file name"), atomic_path(path):
            pass
    assert not (tmp_path / "newdir").exists()


def test_an_unwritable_json_is_found_before_the_simulation(no_work, capsys):
    err = _refused(capsys, ["run", "quickstart", "--json", "nowhere/out.json"], "no folder")
    assert "'nowhere'" in err and "--json" in err


def test_an_output_in_an_existing_folder_is_written(tmp_path, capsys):
    out = tmp_path / "kv.json"
    assert cli.main(["kv", "llama-3.1-8b", "--json", str(out)]) == 0
    assert out.read_text().startswith("{")
