"""Every public callable of the reference refuses bad input in one clear sentence, and never answers wrong.

The fuzz walks every name in the ``__all__`` of the package and of each reference module (the top-level
modules and ``distributed``), takes the one valid call ``fuzz_cases.CASES`` gives for it (a test fails when
a public callable has none: a new function needs an entry), and derives bad calls from it, argument by
argument: a wrong rank, a size that no longer agrees, an integer dtype, float64 among float32, an empty
sequence, a list or a string for a tensor, zero, negative, non-integer, bool and string sizes, token ids past
the vocabulary, an index past its range. Each derived call ends one of four ways:

* clear: a ValueError or TypeError raised by a ``raise`` line of the package, naming the argument;
* vague: such an error that does not name the argument;
* cryptic: any other exception (torch's broadcast error, an IndexError, a ZeroDivisionError...);
* accepted: it returned. That is a *silent* wrong answer when the derived call is certainly invalid
  (a string for a number, 2.5 for an int, an id past the vocabulary, a layer past the model...).

The test fails on every vague, cryptic and silent case, and on a valid call that fails, or that fails
when an int is given as a NumPy integer. Planted defects (a check removed) show that it does.
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import pkgutil
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from fuzz_cases import NOT_FUZZED, cases

import selfattn_lite

PACKAGE = Path(selfattn_lite.__file__).parent
# Sizes that must be >= 1 wherever they appear: 0 or -1 there is certainly invalid.
POSITIVE = {"L", "S", "T", "B", "H", "D", "d", "h", "w", "batch", "d_model", "n_heads", "n_kv_heads", "head_dim",
            "n_layers", "max_len", "block_size", "window", "world_size", "chunk_size", "vocab_size", "n_positions",
            "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_blocks", "in_features",
            "out_features", "heads", "kv_heads", "parts", "block_m", "block_n", "seq_len", "n_pairs", "d_ff",
            "d_state", "n_windows", "n_devices", "batch_size", "dk", "ffn_dim", "max_position", "n_params",
            "batch_heads", "itemsize", "bytes_per_element", "type_vocab_size", "max_new_tokens_", "mixer_"}


# --------------------------------------------------------------------------------------------- the walk
def reference_modules() -> list:
    """The package, its top-level reference modules and ``distributed`` with its modules."""
    names = ["selfattn_lite"]
    names += [f"selfattn_lite.{m.name}" for m in pkgutil.iter_modules(selfattn_lite.__path__)
              if not m.ispkg and not m.name.startswith("_")]
    distributed = importlib.import_module("selfattn_lite.distributed")
    names += ["selfattn_lite.distributed"]
    names += [f"selfattn_lite.distributed.{m.name}" for m in pkgutil.iter_modules(distributed.__path__)]
    return [importlib.import_module(n) for n in names]


def _key(obj, module, name: str) -> str:
    owner = getattr(obj, "__module__", "") or ""
    if owner.startswith("selfattn_lite."):
        return f"{owner.removeprefix('selfattn_lite.')}.{obj.__qualname__}"
    return f"{module.__name__.removeprefix('selfattn_lite.')}.{name}"


def public_callables() -> list[str]:
    """Keys of every public function, class and public method (own, not inherited) of the reference."""
    keys, seen = [], set()
    for module in reference_modules():
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            key = _key(obj, module, name)
            keys.append(key)
            if inspect.isclass(obj) and obj.__module__.startswith("selfattn_lite"):
                for attr, value in vars(obj).items():
                    if attr.startswith("_") and attr != "__call__":
                        continue
                    if inspect.isfunction(value) or isinstance(value, classmethod | staticmethod):
                        keys.append(f"{key}.{attr}")
    return keys


# --------------------------------------------------------------------------------------------- outcomes
@dataclass
class Outcome:
    key: str
    mutation: str          # "argument:kind"
    kind: str              # clear, vague, cryptic, accepted, silent
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind:8} {self.key} [{self.mutation}]: {self.detail}"


def _names_argument(message: str, argument: str) -> bool:
    base = argument.split("[")[0]
    words = {base, base.rstrip("s"), base.replace("_", " ")}
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9_])", message) for w in words if w)


MISMATCHES = ("rank-", "rank+", "size", "empty")


def classify(error: BaseException, argument: str, *, others=(), bad=None, kind: str = "") -> tuple[str, str]:
    """clear, vague or cryptic, and a one-line detail.

    Clear: a deliberate error of the package that names ``argument``; for a size that no longer agrees
    (``MISMATCHES``), naming any argument of the call (``others``) is clear too (the mismatch is between
    two), and so is quoting an unknown string (``bad``) for a lookup.
    """
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    line = linecache.getline(filename, tb.tb_lineno)
    ours = Path(filename).resolve().is_relative_to(PACKAGE)
    where = f"{Path(filename).name}:{tb.tb_lineno}"
    message = str(error).split("\n")[0][:160]
    detail = f"{type(error).__name__} at {where}: {message}"
    if isinstance(error, ValueError | TypeError) and ours and "raise" in line:
        text = str(error)
        named = _names_argument(text, argument)
        named = named or (kind in MISMATCHES and any(_names_argument(text, o) for o in others))
        named = named or (isinstance(bad, str) and kind == "unknown str" and repr(bad) in text)
        return ("clear" if named else "vague"), detail
    return "cryptic", detail


def _run(fn, args, kwargs):
    return fn(*args, **kwargs)


# --------------------------------------------------------------------------------------------- mutations
def _annotation(fn, argument: str) -> str:
    try:
        parameter = inspect.signature(fn).parameters.get(argument.split("[")[0])
    except (TypeError, ValueError):
        return ""
    return "" if parameter is None or parameter.annotation is inspect.Parameter.empty else str(parameter.annotation)


def _int_only(annotation: str) -> bool:
    return bool(re.search(r"\bint\b", annotation)) and "float" not in annotation and "str" not in annotation


def mutations(fn, argument: str, value, case) -> list[tuple[str, object, bool]]:
    """(kind, bad value, certainly invalid) for one argument of a valid call."""
    out = []
    if isinstance(value, torch.Tensor):
        ids = case.ids.get(argument.split("[")[0])
        out.append(("str", "abc", True))
        out.append(("list", value.tolist(), False))
        if value.dim() >= 1:
            out.append(("rank-", value.reshape(-1)[0] if value.dim() == 1 else value.reshape(-1), False))
            out.append(("rank+", value[None, None], False))
            grown = torch.cat([value, value.narrow(-1, 0, 1)], dim=-1) if value.shape[-1] else value
            out.append(("size", grown, False))
        if value.dim() >= 2:
            out.append(("empty", value.narrow(-2, 0, 0), False))
        if value.is_floating_point():
            out.append(("int", value.round().long(), False))
            if value.dtype == torch.float32:
                out.append(("float64", value.double(), False))
        elif value.dtype == torch.bool:
            out.append(("int", value.long(), False))
            out.append(("float", value.float(), False))
        else:
            out.append(("float", value.float(), ids is not None))
            if ids is not None and value.numel():
                past, negative = value.clone(), value.clone()
                past.view(-1)[0] = ids
                negative.view(-1)[0] = -1
                out.append(("id past the vocabulary", past, True))
                out.append(("negative id", negative, True))
    elif isinstance(value, bool):
        out.append(("str", "yes", True))
    elif isinstance(value, int):
        annotation = _int_only(_annotation(fn, argument))
        base = argument.split("[")[0]
        positive = value >= 1 and (base in POSITIVE or base in case.positive)
        out += [("0", 0, positive), ("-1", -1, positive and base not in case.index), ("2.5", 2.5, annotation),
                ("bool", True, annotation), ("str", str(value), True)]
        if base in case.index:
            n = case.index[base]
            out += [("index past the end", n, True), ("index before the start", -n - 1, True)]
    elif isinstance(value, float):
        out += [("str", str(value), True), ("nan", float("nan"), False), ("-1.0", -1.0, False)]
    elif isinstance(value, str):
        out += [("unknown str", "no-such-value", False), ("int", 3, False)]
    elif isinstance(value, list | tuple) and value and all(isinstance(t, torch.Tensor) for t in value):
        out += [("empty list", [], False), ("str", "abc", True)]
    elif isinstance(value, list | tuple) and value:
        out += [("empty list", [], False), ("str", "abc", False)]
    return [(k, v, certain) for k, v, certain in out if f"{argument}:{k}" not in case.valid]


def _bound(fn, args, kwargs) -> list[tuple[str, str | int]]:
    """(argument name, where) for each argument of the call: where is a position or a keyword."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [(f"arg{i}", i) for i in range(len(args))] + [(n, n) for n in kwargs]
    out = []
    for i in range(len(args)):
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if i < len(positional):
            out.append((positional[i].name, i))
        else:
            star = next((p.name for p in parameters if p.kind == p.VAR_POSITIONAL), "args")
            out.append((f"{star}[{i - len(positional)}]", i))
    return out + [(n, n) for n in kwargs]


def fuzz(key: str, case) -> list[Outcome]:
    """Every derived call of one case, classified (the valid call and its NumPy-int twin first)."""
    try:
        fn, args, kwargs = case.make()
        _run(fn, args, kwargs)
    except Exception as error:  # noqa: BLE001
        return [Outcome(key, "valid call", "broken", f"{type(error).__name__}: {error}"[:200])]
    if not case.mutate:
        return []
    outcomes = []
    names = [a for a, _ in _bound(fn, args, kwargs)]
    for argument, where in _bound(fn, args, kwargs):
        fn, args, kwargs = case.make()
        value = args[where] if isinstance(where, int) else kwargs[where]
        if isinstance(value, int) and not isinstance(value, bool):
            numpy_args, numpy_kwargs = list(args), dict(kwargs)
            if isinstance(where, int):
                numpy_args[where] = np.int64(value)
            else:
                numpy_kwargs[where] = np.int64(value)
            try:
                _run(fn, numpy_args, numpy_kwargs)
            except Exception as error:  # noqa: BLE001
                outcomes.append(Outcome(key, f"{argument}:numpy int", "refused",
                                        f"{type(error).__name__}: {error}"[:200]))
        for kind, bad, certain in mutations(fn, argument, value, case):
            fn, args, kwargs = case.make()
            if isinstance(where, int):
                args[where] = bad
            else:
                kwargs[where] = bad
            try:
                _run(fn, args, kwargs)
            except Exception as error:  # noqa: BLE001
                verdict, detail = classify(error, argument, others=names, bad=bad, kind=kind)
            else:
                verdict, detail = ("silent" if certain else "accepted"), "returned"
            outcomes.append(Outcome(key, f"{argument}:{kind}", verdict, detail))
    return outcomes


FAILING = ("broken", "refused", "vague", "cryptic", "silent")


@pytest.fixture(scope="module")
def process_group():
    """A one-process gloo group, for the distributed functions (destroyed after this file)."""
    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def all_outcomes(process_group) -> list[Outcome]:
    table = cases()
    return [o for key in public_callables() if key in table for o in fuzz(key, table[key])]


# --------------------------------------------------------------------------------------------- the tests
def test_every_public_callable_has_a_valid_call():
    table = cases()
    keys = public_callables()
    missing = [k for k in keys if k not in table and k not in NOT_FUZZED]
    assert not missing, f"public callables without a valid call in fuzz_cases.CASES: {missing}"
    stale = [k for k in [*table, *NOT_FUZZED] if k not in keys]
    assert not stale, f"fuzz_cases names callables that are not public (renamed?): {stale}"


def test_every_bad_input_is_refused_clearly(all_outcomes):
    bad = [str(o) for o in all_outcomes if o.kind in FAILING]
    counts = {kind: sum(o.kind == kind for o in all_outcomes)
              for kind in ("clear", "accepted", *FAILING)}
    assert not bad, f"{len(bad)} of {len(all_outcomes)} derived calls fail ({counts}):\n" + "\n".join(bad)
    assert counts["clear"] > 500          # the walk really ran


# --------------------------------------------------------------------------------------------- planted
def test_a_removed_shape_check_is_reported(monkeypatch):
    """delta_rule_step without its checks: a wrong state shape becomes torch's error, or broadcasts."""
    from selfattn_lite import recurrent

    monkeypatch.setattr(recurrent, "_check_delta_step", lambda *args: None)
    outcomes = fuzz("recurrent.delta_rule_step", cases()["recurrent.delta_rule_step"])
    assert any(o.kind == "cryptic" for o in outcomes)


def test_a_removed_number_check_is_reported_as_silent(monkeypatch):
    """mla_decode_bytes without its check of bytes_per_value: "2" repeats a string (222...2) instead of failing."""
    from selfattn_lite import mla

    monkeypatch.setattr(mla, "check_real", lambda name, x, **kw: x)
    case = cases()["mla.mla_decode_bytes"]
    make = case.make
    case.make = lambda: (make()[0], make()[1], {**make()[2], "form": "absorbed", "bytes_per_value": 2})
    outcomes = fuzz("mla.mla_decode_bytes", case)
    assert any(o.kind == "silent" and o.mutation == "bytes_per_value:str" for o in outcomes)


def test_a_removed_vocabulary_check_is_reported(monkeypatch):
    """RecallModel without its id check: an id past the vocabulary is torch's IndexError."""
    from selfattn_lite import recall_models

    monkeypatch.setattr(recall_models.RecallModel, "_check_ids", lambda self, ids: ids)
    outcomes = fuzz("recall_models.RecallModel.forward", cases()["recall_models.RecallModel.forward"])
    assert any(o.kind == "cryptic" and o.mutation == "ids:id past the vocabulary" for o in outcomes)


def test_the_verdicts_read_the_raising_line_and_the_message():
    from selfattn_lite._checks import check_int

    ours = pytest.raises(ValueError, check_int, "m", 0, low=1).value
    assert classify(ours, "m")[0] == "clear"
    assert classify(ours, "n")[0] == "vague"                        # names another argument
    theirs = pytest.raises(RuntimeError, torch.ones(2).view, 3).value
    assert classify(theirs, "x")[0] == "cryptic"                    # torch's own error
    index = pytest.raises(IndexError, lambda: [][0]).value
    assert classify(index, "x")[0] == "cryptic"
