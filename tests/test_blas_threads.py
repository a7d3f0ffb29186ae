"""The CLI keeps numpy's BLAS to one thread (llama.cpp owns the cores), unless the user set it."""

import os
import subprocess
import sys

import pytest

CODE = "import specgen.cli, os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"


@pytest.mark.parametrize("given, expected", [(None, "1"), ("3", "3")])
def test_blas_threads(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
