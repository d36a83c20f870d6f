"""Benchmark (not a test): every ACT, Diffusion Policy, SmolVLA and pi0 checkpoint config of
tests/test_policy_configs.py, the ones the suite leaves to benchmarks included, with each config's
end-to-end figure.

    .venv/bin/python benchmarks/bench_policy_configs.py [-k "test_act or test_diffusion"]

Runs the tests in one process (`-m "benchmark or not benchmark"`, JUnit XML to a private temporary
folder) and prints one row per config: the chained ONNX files against LeRobot's `select_action` over
two chunks, the `.pte` file against the ONNX one where the config exports it (ACT: the policy graph's
second chunk; the others: the camera graph), and the time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS = tuple(f"tests/test_policy_configs.py::test_{family}_checkpoint_configs_reproduce_select_action"
              for family in ("act", "diffusion", "smolvla", "pi0"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default=None, help="pytest -k expression (e.g. test_smolvla, test_pi0, 3cams)")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "benchmark or not benchmark",
               f"--junitxml={report}", *TESTS, *(["-k", args.k] if args.k else [])]
        rc = subprocess.run(cmd, cwd=root).returncode
        cases = ET.parse(report).getroot().iter("testcase")
        print("\n| family | config | select_action SNR dB (2 chunks) | .pte vs ONNX dB | result | s |")
        print("|---|---|---|---|---|---|")
        for case in cases:
            props = {p.get("name"): float(p.get("value")) for p in case.iter("property")}
            family = case.get("name").split("_")[1]
            config = case.get("name").split("[", 1)[1].rstrip("]")
            result = "fail" if case.find("failure") is not None or case.find("error") is not None else "pass"
            snr, pte = props.get("select_action_snr_db"), props.get("pte_vs_onnx_snr_db")
            print(f"| {family} | {config} | {'-' if snr is None else f'{snr:.1f}'} | {'-' if pte is None else f'{pte:.1f}'} "
                  f"| {result} | {float(case.get('time')):.1f} |")
    return rc


if __name__ == "__main__":
    sys.exit(main())
