"""One command-line invocation: what every command does before and after its analysis.

:func:`session` turns SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 into the same clean stop as
Ctrl-C, sends the model's prints to stderr, and turns every error into one stderr line
(library parameters spelt as the command's flags) and an exit code (0 ok, 1 a check failed
or the forward raised, 2 bad input, 128+N a signal). :class:`Session` checks outputs before
any work, resolves inputs, loads the model and runs the progress bar. Under torchrun each
rank drives its part of the inputs and rank 0 alone merges, checks outputs and writes.
Nothing here imports torch at module level, so ``hookscope --help`` stays fast.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback as tb
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hookscope.core.errors import HookscopeError, param
from hookscope.core.load_options import InputOptions, LoadOptions
from hookscope.core.streams import prints_to_stderr

if TYPE_CHECKING:
    from hookscope.core.distributed import Group
    from hookscope.core.files import Output
    from hookscope.core.run import Probe
    from hookscope.inputs.resolve import Batch, InputSet
    from hookscope.render.console import Bar
    from hookscope.sources import LoadedModel

R = TypeVar("R")
Out = TypeVar("Out", bound="Output | None")
#: Signals handled like Ctrl-C: every temporary file is removed and one line printed.
SIGNALS = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
#: Commands that explain or differentiate class logits.
NEEDS_LOGITS = frozenset({"gradcam", "grads", "ablate", "watch"})
#: The commands whose reports merge, and so run under torchrun.
DISTRIBUTED = ("stats", "grads", "debug", "ablate", "check")


class Interrupted(KeyboardInterrupt):
    """A signal asked hookscope to stop; it unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def _signals() -> Iterator[None]:
    previous = {}
    for name in SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            with suppress(ValueError):  # not the main thread (e.g. a test runner's worker)
                previous[number] = signal.signal(number, _raise_interrupted)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def session(flags: Mapping[str, str], command: str | None, *, quiet: bool = False,
            traceback: bool = False, output: Path | None = None, force: bool = False,
            model: str = "", inputs: Sequence[str] = (), folders: Sequence[Path] = (),
            **model_options: Any) -> Iterator[Session]:
    """Run one command: every error becomes one stderr line and its exit code. ``flags``
    spells each library parameter as the command's flag (``target`` -> ``--target``).
    ``--output``, the output ``folders`` (``--out``) and the ``inputs`` paths are checked
    before anything imports torch."""
    from hookscope.core.distributed import Group
    from hookscope.core.files import check_folder, resolve_output
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    s = Session(Group(), output, force=force)

    def failed(message: str, code: int, *, stopped: bool = False) -> SystemExit:
        line = s.group.line(message, stopped=stopped)  # under torchrun: which rank, if any
        if line is not None:
            console.error(line)
        if s.group.broken:  # the one exit that leaves a broken process group alone
            s.group.abandon(code)
        return SystemExit(code)

    try:
        with _signals(), prints_to_stderr():  # a model's print cannot break the JSON
            s.group.join(command, DISTRIBUTED)
            s.model = ModelOptions.given(model, **model_options)  # a bad --seed: one line too
            # --output is checked before any work; only rank 0 writes.
            s.out = s._claim(resolve_output(output if s.group.leader else None, force=force))
            for folder in folders if s.group.leader else ():
                check_folder(folder, force=force)  # its files are checked once planned
            _exist(model, inputs)
            yield s
    except HookscopeError as exc:
        if traceback:
            tb.print_exc()
        raise failed(exc.render(lambda name: flags.get(name, name)), exc.exit_code) from None
    except Interrupted as exc:
        why = " (torchrun stops every rank once one has exited: its report names that rank)" \
            if s.group.size > 1 else ""
        raise failed(f"stopped by {exc}{why}; no output was written", 128 + exc.signum,
                     stopped=True) from None
    except KeyboardInterrupt:
        raise failed("interrupted; no output was written", 130, stopped=True) from None
    except BrokenPipeError:  # `hookscope ... | head`: the reader left; not an error
        sys.stderr.close()
        raise SystemExit(0) from None
    finally:
        s.group.close()


def _exist(model: str, inputs: Sequence[str]) -> None:
    """Refuse an INPUT path that does not exist, as resolving the inputs would, but before
    torch is imported (seconds, more on a loaded machine). A training log given with INPUT
    is left to its own, better line."""
    from hookscope.training.log_reader import is_log

    if is_log(model):
        return
    for spec in inputs:
        if spec != "-" and not os.path.exists(os.path.expanduser(spec)):
            raise HookscopeError(f"{spec}: no such file or directory.")


@dataclass(frozen=True, kw_only=True)
class ModelOptions(InputOptions):
    """MODEL, the library's load options, and how the inputs are read."""

    name: str
    load: LoadOptions = field(default_factory=LoadOptions)

    @classmethod
    def given(cls, name: str, **values: Any) -> ModelOptions:
        """From the command line's values: :class:`InputOptions`' by name, the rest
        :class:`LoadOptions`' (HookscopeError: a bad seed, mean or std)."""
        own = {f.name for f in fields(InputOptions)}
        load = LoadOptions(**{k: v for k, v in values.items() if k not in own})
        return cls(name=name, load=load, **{k: v for k, v in values.items() if k in own})


class Session:
    """One invocation's shared options and the steps every command shares, in the order
    commands take them; ``group`` is this process's place in the run (under torchrun, one
    of its ranks)."""

    model: ModelOptions
    out: Output  #: where data goes (``--output``)

    def __init__(self, group: Group, output: Path | None = None, *, force: bool = False) -> None:
        self.group, self.path, self.force = group, output, force
        self.writes: list[Path] = []  # the files this run will replace: never one it reads
        self.data: Any = None  # --data's hookscope.inputs.data.DataSource, once resolved
        self.nothing = False  # no INPUT: one call of no arguments, if the forward takes none

    # ------------------------------------------------------------------ the steps

    def plot_output(self, path: Path | None) -> Output | None:
        """Where ``--plot`` goes (None: no plot), checked now, its suffix too."""
        from hookscope.render.plots import plot_output

        return self._claim(plot_output(path if self.group.leader else None, force=self.force))

    def _claim(self, output: Out) -> Out:
        if output is not None and output.target is not None:
            self.writes.append(output.target)
        return output

    def folder(self, path: Path, planned: Iterable[Path]) -> None:
        """An output folder and the files planned in it, checked now."""
        from hookscope.core.files import check_folder

        if self.group.leader:
            planned = list(planned)
            self.writes += planned
            check_folder(path, planned=planned, force=self.force)

    def reading(self, paths: Iterable[Path | str | None], what: str = "an input of this run"
                ) -> None:
        """Refuse to write any file the run reads (the same file by any name): an output
        that replaced an input or the weights is never what was meant, ``--force`` or not."""
        written = {_file_id(target): target for target in self.writes}
        written.pop(None, None)  # not there yet: then it is nothing the run reads
        for path in paths if written else ():
            target = None if path is None else written.get(_file_id(path))
            if target is not None:
                raise HookscopeError(f"{target} is {what} ({path}); writing the output there "
                                     "would replace it. Choose another output.")

    def inputs(self, specs: Sequence[str]) -> InputSet:
        """Resolve inputs before the model loads, so a bad path fails fast (HookscopeError: a
        bad input; under torchrun, ``-`` or ranks that resolved other inputs than rank 0)."""
        from hookscope.inputs.resolve import STDIN, resolve_inputs
        from hookscope.sources import resolve

        if self.group.size > 1 and STDIN in specs:
            raise HookscopeError("'-' (stdin) cannot be read under torchrun, where every "
                                 "process would need it; pass the image as a file.")
        options = self.model
        if options.data is not None:
            from hookscope.inputs.data import DataSource
            from hookscope.sources.code import load_data

            if specs:
                raise HookscopeError(f"Give INPUT files or {param('data')}, not both.")
            self.reading([options.data.rpartition(":")[0]], "a file the data is loaded from")
            self.data = DataSource(load_data(options.data, options.load.seed), options.data,
                                   limit=None if options.shuffle else options.limit)
        self.nothing = not specs and self.data is None
        resolved = resolve_inputs(specs, ndim=resolve(options.name).input_ndim,
                                  recursive=options.recursive, limit=options.limit,
                                  shuffle=options.shuffle, seed=options.load.seed, data=self.data,
                                  nothing=True, as_is=options.as_is)
        self.reading(item.path for item in resolved.items)
        self.group.agree(resolved.names)
        return resolved

    def load(self, command: str, options: ModelOptions | None = None) -> LoadedModel:
        """Load MODEL (or the one ``options`` name), refusing kinds ``command`` cannot run
        and sizes that cannot fit."""
        from hookscope import sources
        from hookscope.core.arguments import takes_nothing
        from hookscope.inputs.resolve import NO_INPUTS
        from hookscope.sources import check_batch_memory, check_supported

        options = options or self.model
        spec = sources.resolve(options.name)
        code = [spec.target, spec.target.rpartition(":")[0]] \
            if spec.source not in ("torchvision", "timm") else []
        self.reading([options.load.weights, options.load.labels, *code], "a file the model is loaded from")
        check_supported(spec, needs_logits=command in NEEDS_LOGITS,
                        needs_images=command == "gradcam")
        loaded = sources.load(spec, options.load)
        if self.nothing and not takes_nothing(loaded.model):
            raise HookscopeError(NO_INPUTS)
        check_batch_memory(loaded, options.batch_size)
        if self.data is not None:  # --data: its labels by this forward
            self.data.bind(loaded.model)
        return loaded

    def drive(self, loaded: LoadedModel, inputs: Any, probe: Probe[R], **options: Any) -> R:
        """Run the loaded model over ``inputs`` for ``probe``, at its precision. Under
        torchrun the report is every rank's merged, on rank 0; the other ranks exit here."""
        from hookscope.core.run import drive

        merged = self.group.gathered(drive(loaded.model, inputs, probe, autocast=loaded.autocast,
                                           **options))
        if merged is None:  # another rank: rank 0 writes; this one leaves without the teardown
            self.group.abandon(0)  # that can abort it (see Group.abandon)
        return merged

    def run(self, loaded: LoadedModel, inputs: InputSet, probe: Probe[R], label: str, *,
            shown: bool, **drive_options: Any) -> R:
        """Decode ``inputs`` and drive ``probe`` over them, with a progress bar labelled
        ``label`` when ``shown``."""
        with self.progress(len(inputs), label, enabled=shown) as bar:
            return self.drive(loaded, self.batches(inputs, loaded), probe, progress=bar,
                              **drive_options)

    def batches(self, inputs: InputSet, loaded: LoadedModel, *, keep_images: bool = False
                ) -> Iterator[Batch]:
        """Decode and preprocess the inputs (under torchrun, this rank's part of them) in
        ``workers`` DataLoader processes (default: from the CPU count)."""
        from hookscope.core.distributed import shard
        from hookscope.inputs.dataset import default_workers
        from hookscope.inputs.resolve import iter_batches

        size, workers = self.model.batch_size, self.model.workers
        inputs = inputs.part(*shard(len(inputs), size, self.group.rank, self.group.size))
        if workers is None:
            workers = default_workers(inputs, size, self.group.local_size)
        return iter_batches(inputs, loaded.preprocess, batch_size=size,
                            keep_images=keep_images, ndim=loaded.input_ndim, workers=workers)

    def progress(self, total: int | None, label: str, *, enabled: bool = True
                 ) -> AbstractContextManager[Bar]:
        """A progress bar on stderr (only on a terminal, and not under torchrun, where no
        process sees the others' progress)."""
        from hookscope.render import console

        return console.progress(total, label, enabled=enabled and self.group.size == 1)

    def shown(self, fmt: str) -> bool:
        """Whether a progress bar fits: a table, or data that does not go to stdout."""
        return fmt == "table" or not self.out.is_stdout

    def emit(self, command: str, doc: Any, fmt: str, output: Output | None = None,
             **options: Any) -> None:
        """Write the command's document (or the report a page draws) through its view, to
        ``output`` (default: ``--output``)."""
        from hookscope.render.views import emit

        emit(command, doc, fmt, self.out if output is None else output, **options)


def _file_id(path: Path | str) -> tuple[int, int] | None:
    """The file at ``path`` whatever its name (device and inode), or None: no file there."""
    with suppress(OSError):
        st = os.stat(path)
        return st.st_dev, st.st_ino
    return None


# ----------------------------------------------------------------------------- diff's two sides


#: Each ``against_*`` option and the model option it replaces for side B.
AGAINST = {"against_model": "name", "against_weights": "weights", "against_dtype": "dtype",
           "against_autocast": "autocast", "against_device": "device"}


def against_options(options: ModelOptions, against: Mapping[str, Any]) -> ModelOptions:
    """Side B's options: A's, with each given ``against_*`` option replaced (HookscopeError:
    none is given, or the dtype is unknown)."""
    from hookscope.sources import DTYPES

    given = {AGAINST[k]: v for k, v in against.items() if v is not None}
    if not given:
        flags = ", ".join(param(p) for p in AGAINST)
        raise HookscopeError(f"Nothing to compare against: give at least one of {flags}; or "
                             "give two saved `stats` JSON documents (diff a.json b.json).")
    dtype = given.get("dtype")
    if dtype is not None and dtype.strip().lower() not in DTYPES:
        raise HookscopeError(f"{param('against_dtype')} {dtype!r}: choose one of "
                             f"{', '.join(DTYPES)}.")
    name = given.pop("name", options.name)
    return replace(options, name=name, load=replace(options.load, **given))


def offline_files(model: str, inputs: Sequence[str],
                  against: Mapping[str, Any] | None = None) -> tuple[Path, Path] | None:
    """The two documents of an offline diff (MODEL and the one INPUT are ``.json``), or None
    (HookscopeError: MODEL is a ``.json`` file but the rest does not fit an offline diff)."""
    if not model.lower().endswith(".json"):
        return None
    if len(inputs) != 1 or not inputs[0].lower().endswith(".json"):
        raise HookscopeError("An offline diff compares two saved `stats` documents: "
                             "hookscope diff a.json b.json (one INPUT, a .json file).")
    given = [name for name, value in (against or {}).items() if value not in (None, False)]
    if given:
        raise HookscopeError(f"{param(given[0])} has no meaning in an offline diff of two saved "
                             "documents; leave it out.")
    return Path(model), Path(inputs[0])
