"""install.sh: the one install command, with the AMX workaround only where the CPU reports AMX."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPY = "import os, sys; print(os.environ.get('CMAKE_ARGS')); print(' '.join(sys.argv[1:]))"


def _install(tmp_path, flags: str, *args, cmake_args=None):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n")
    spy = tmp_path / "python"
    spy.write_text(f"#!{sys.executable}\n{SPY}\n")
    spy.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}
    env.update(SPECGEN_CPUINFO=str(cpuinfo), PYTHON=str(spy))
    if cmake_args:
        env["CMAKE_ARGS"] = cmake_args
    out = subprocess.run(["sh", str(ROOT / "install.sh"), *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines(), out.stderr


def test_without_amx_nothing_is_added(tmp_path):
    (cmake, argv, _, pull), err = _install(tmp_path, "avx512f")
    assert cmake == "None" and argv == "-m pip install .[test]" and err == ""
    assert pull == "-m specgen pull qwen2.5-coder-1.5b"  # the test install brings the tests' real pair


def test_with_amx_the_kernels_are_compiled_out(tmp_path):
    (cmake, argv, _, _), err = _install(tmp_path, "amx_bf16 amx_tile amx_int8")
    assert "-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" in cmake
    assert "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" in cmake
    assert argv == "-m pip install .[test]" and "AMX" in err


@pytest.mark.parametrize("flags", ["", "amx_tile"])
def test_a_users_cmake_args_and_pip_arguments_are_kept(tmp_path, flags):
    (cmake, argv), _ = _install(tmp_path, flags, ".", "--no-deps", cmake_args="-DGGML_CUDA=on")
    assert cmake.startswith("-DGGML_CUDA=on") and argv == "-m pip install . --no-deps"
    assert ("mno-amx" in cmake) == bool(flags)


def test_ci_installs_as_the_readme_says():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    assert "sh install.sh\n" in readme and "\nsh install.sh\n" in ci
