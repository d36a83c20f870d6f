"""Run one export job in a forked child process, so that whatever the job allocates ends with it.

Why: lowering and parity leave native memory behind that neither the garbage collector nor
`malloc_trim` returns (ExecuTorch / XNNPACK lowering, ONNX Runtime sessions, allocator arenas):
run in one process, the 0.6b Qwen3-TTS cpu export grows 8.0, 8.2, 9.1, 10.9 GB after its first
four jobs. A job in its own process returns everything when it exits, so the
export's peak is that of its largest job, not the sum of what every job left.

Why fork and not a fresh process: the child shares the parent's eager model and the samples the
recipe generated (minutes of eager frames at 0.6b) copy-on-write, without building them again.

What fork costs: torch's CPU thread pool (GNU OpenMP in the PyPI wheels) does not survive a fork:
a child that enters a parallel region with the parent's pool hangs. The child therefore runs torch
on one thread (`torch.set_num_threads(1)`, which keeps it out of OpenMP). Lowering is
single-threaded Python anyway; the runtimes that run the artifacts (ONNX Runtime, ExecuTorch's
XNNPACK, llama.cpp) create their own thread pools in the child and keep the requested threads.

Temporary files: a child ends with `os._exit`, so nothing it registered with `atexit` runs, and
libraries clean their temporary files there (coremltools' converted `tmp*.mlpackage`, edgex's own
QNN graph folder) or never (qai-hub's zipped uploads and downloaded datasets). Each child therefore
gets a private temporary folder, made here before the fork and set as its `tempfile.tempdir` and
`TMPDIR` (for the tools it starts): this process removes it when the child has ended, however it
ended (an exception, SIGKILL), so nothing a job's libraries put in temp outlives the job. What a job
returns lies outside it: artifacts are written under the export's staging folder.

Linux only (where fork after threads is what every Python data loader relies on); elsewhere the
job runs in this process, as before, with the process's own temporary folder: what a job keeps there
for the next (the QNN graph, the Core ML fp16 program its w8 / w4 jobs compress) must outlive it.
The libraries' `atexit` clean-ups run when that process exits, and the calls that leave files even
then run with `private_tempdir`.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


class ChildDied(RuntimeError):
    """The job's process ended without a result: killed (the OOM killer's SIGKILL), or crashed.
    `signal`: the signal's name when one ended it, else None."""

    def __init__(self, message: str, signal: str | None = None):
        super().__init__(message)
        self.signal = signal


def _signal_name(status: int) -> str | None:
    if not os.WIFSIGNALED(status):
        return None
    try:
        return signal.Signals(os.WTERMSIG(status)).name
    except ValueError:
        return str(os.WTERMSIG(status))


def forking_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def die_with_parent() -> None:
    """Linux: the kernel sends this process SIGTERM when its parent dies (killed, even with
    SIGKILL). Without it a child outlives a killed export and lowers on for minutes as an orphan."""
    import ctypes

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG


@contextmanager
def private_tempdir() -> Iterator[Path]:
    """Python's temporary folder (`tempfile.gettempdir()`) is a fresh folder for the block, removed
    with what is in it when the block ends. For library calls in this process that leave temporary
    files behind (a forked job gets the same from `run_forked`). `TMPDIR` is left alone: setting the
    environment is not safe while other threads may read it."""
    saved = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="edgex-tmp-", ignore_cleanup_errors=True) as folder:
        tempfile.tempdir = folder
        try:
            yield Path(folder)
        finally:
            tempfile.tempdir = saved


_MODULE_CALL_HOOKS: set = set()  # handles of `between_module_calls` hooks in force


@contextmanager
def between_module_calls(point: Callable[[], None]) -> Iterator[None]:
    """`point()` before every module call this thread makes in the block: the moments a thread
    running eager torch has no op under way and holds none of torch's locks, so another thread may
    fork then (`edgex.side_by_side` pauses the thread there). The hook is global to torch; a forked
    child drops it (`_child_setup`)."""
    import threading

    import torch

    me = threading.get_ident()

    def hook(_module, _args):
        if threading.get_ident() == me:
            point()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    _MODULE_CALL_HOOKS.add(handle)
    try:
        yield
    finally:
        _MODULE_CALL_HOOKS.discard(handle)
        handle.remove()


def _child_setup(scratch: str) -> None:
    import torch

    die_with_parent()
    for handle in list(_MODULE_CALL_HOOKS):  # another thread's, in the parent
        handle.remove()
    _MODULE_CALL_HOOKS.clear()
    tempfile.tempdir = scratch
    os.environ["TMPDIR"] = scratch
    torch.set_num_threads(1)
    # Standard streams with locks of their own: a thread of the parent (a progress bar's refresh)
    # may have held the old ones' locks at the instant of the fork, and no thread here releases them.
    for name, fd in (("stdout", 1), ("stderr", 2)):
        try:
            setattr(sys, name, open(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace", closefd=True))
        except OSError:
            pass


def _describe(status: int) -> str:
    name = _signal_name(status)
    if name is not None:
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with status {os.WEXITSTATUS(status)} without a result"


def run_forked(fn: Callable[..., T], *args, label: str = "the forked process") -> T:
    """`fn(*args)` in a forked child; its return value, or its exception re-raised here. The result
    and any exception must pickle. Raises `ChildDied` (its message starts with `label`) if the
    child ends without one. The child's temporary files are removed when it ends (module doc)."""
    return start_forked(fn, *args, label=label).result()


def run_forked_for(component, label: str, fn: Callable[..., T], *args) -> T:
    """`run_forked(fn, *args)` for work on `component` (an `edgex.component.Component`): what the
    child computed for it (eager reference outputs, tensors read, calibration activations) comes
    back and is kept here (`Component.adopt`), so later work in this process does not compute it
    again."""
    result, added = run_forked(computing, component, fn, *args, label=label)
    component.adopt(added)
    return result


def computing(component, fn: Callable[..., T], *args) -> tuple[T, object]:
    """`fn(*args)`, and what it computed for `component` meanwhile (for `Component.adopt`)."""
    before = component.computed()
    return fn(*args), component.added_since(before)


class Forked:
    """A child forked by `start_forked`: `result()` waits for what it returns (any thread may wait),
    `stop()` kills it. Either removes its temporary folder."""

    def __init__(self, fn: Callable[..., T], args: tuple, label: str):
        self._label = label
        self._scratch = tempfile.TemporaryDirectory(prefix="edgex-job-", ignore_cleanup_errors=True)
        read_end, write_end = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's stack
            os.close(read_end)
            _run_child(fn, args, self._scratch.name, write_end)
        os.close(write_end)
        self.pid, self._pipe = pid, os.fdopen(read_end, "rb")

    def result(self):
        try:
            try:
                with self._pipe:
                    payload = self._pipe.read()
                _, status = os.waitpid(self.pid, 0)
            except BaseException:  # interrupted (Ctrl-C): the child goes too
                _stop(self.pid)
                raise
        finally:
            self._scratch.cleanup()
        if not payload:
            raise ChildDied(f"{self._label} {_describe(status)}", _signal_name(status))
        kind, value = pickle.loads(payload)
        if kind == "raise":
            raise value
        return value

    def stop(self) -> None:
        _stop(self.pid)


class RanHere:
    """A call that ran in this process, with a forked child's `result()` / `stop()`: `start_forked`
    where there is no fork, or a job that must not fork."""

    def __init__(self, fn: Callable[..., T], args: tuple):
        try:
            self._outcome = ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001 - raised by result(), as a child's would be
            self._outcome = ("raise", exc)

    def result(self):
        kind, value = self._outcome
        if kind == "raise":
            raise value
        return value

    def stop(self) -> None:
        pass


def start_forked(fn: Callable[..., T], *args, label: str = "the forked process") -> "Forked | RanHere":
    """Fork a child that computes `fn(*args)` (see `run_forked`) and return at once: the fork has
    happened when this returns, so the caller may go on with work of its own (forking while another
    thread of this process runs torch would copy its locks mid-use). Where there is no fork, `fn`
    runs here before this returns."""
    if not forking_supported():
        return RanHere(fn, args)
    return Forked(fn, args, label)


def _run_child(fn: Callable, args: tuple, scratch: str, write_end: int) -> None:
    code = 0
    try:
        _child_setup(scratch)
        try:
            outcome = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which re-raises it
            outcome = ("raise", exc)
        try:
            payload = pickle.dumps(outcome)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            payload = pickle.dumps(("raise", RuntimeError(f"{type(exc).__name__} passing the job's result back: {exc}")))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001 - nothing may unwind into the parent's code
        code = 70
    finally:
        os._exit(code)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
