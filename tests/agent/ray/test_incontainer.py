"""The program the docker runtime runs inside a Ray head container: its functions, and the whole program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.ray import incontainer
from agent.ray.incontainer import helper


def test_the_gcs_address_is_ray_address_then_the_heads_file_then_loopback(tmp_path: Path):
    current = tmp_path / "ray_current_cluster"
    env = {"RAY_ADDRESS": "10.0.0.7:40001"}
    assert helper.gcs_address("6390", environ=env, current=str(current)) == "10.0.0.7:40001"
    assert helper.gcs_address("6390", environ={}, current=str(current)) == "127.0.0.1:6390"
    current.write_text("10.0.0.8:6390\n")
    assert helper.gcs_address("6390", environ={}, current=str(current)) == "10.0.0.8:6390"
    assert helper.gcs_address("6390", environ={"RAY_ADDRESS": ""}, current=str(current)) == "10.0.0.8:6390"


def test_unknown_actions_and_wrong_arguments_are_refused():
    for argv in ([], ["restart"], ["status"], ["drain", "6390", "node"]):
        with pytest.raises(SystemExit):
            helper.answer(argv)


def test_the_answer_line_reads_back_and_a_missing_one_fails_with_the_output():
    line = helper.render({"accepted": True, "message": ""})
    assert incontainer.result_of(0, f"some log\n{line}\n", "ray drain") == {"accepted": True, "message": ""}
    with pytest.raises(CommandFailed) as err:
        incontainer.result_of(1, "Error: no such container", "ray status")
    assert err.value.code == "not_found"
    assert "ray status failed (exit 1): Error: no such container" in err.value.message
    with pytest.raises(CommandFailed) as err:
        incontainer.result_of(0, "", "ray status")
    assert err.value.code == "internal"


def test_the_program_is_the_gcs_module_then_the_helper():
    program = incontainer.program()
    gcs = Path(incontainer.__file__).parent.parent / "gcs.py"
    assert program.startswith(gcs.read_text())
    assert program.rstrip().endswith("sys.exit(main())")
    compile(program, "<in-container>", "exec")
    assert helper.MARKER == incontainer.MARKER


def test_the_program_runs_without_the_agent_package(tmp_path: Path):
    """As in a Ray container: only the standard library importable (no site-packages), arguments after ``-c``."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", incontainer.program(), "restart"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 1
    assert "unknown action or wrong arguments: restart" in done.stderr
    assert "ModuleNotFoundError" not in done.stderr
