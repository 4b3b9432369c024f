"""Inside the child: a built configuration judged on the user's held-out data (`--eval-data` with
`--eval-split`), beside PyTorch's fp32 eager model on the same items. The child counts; the harness
turns the counts into figures with intervals (`autotune.measure.quality`).

- A classifier: per item, whether fp32 eager and the configuration each got the label right (the
  four paired counts, from which accuracy, its interval and the paired drop follow), and whether
  their top-1 answers agree.
- A causal LM: per window, the mean negative log-likelihood of its scored tokens under fp32 and
  under the configuration (perplexity and its paired drop over windows), and per scored position
  the KL divergence from fp32's next-token distribution to the configuration's and whether their top
  tokens agree, as llama.cpp's `llama-perplexity --kl-divergence` reports them.

torch is imported inside functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autotune.child import evaldata
from autotune.model.errors import ApplyError

KL_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)  # of the per-position KL divergence, as llama-perplexity prints them


def classifier(reference: Callable[[Any], Any], candidate: Callable[[Any], Any], data: evaldata.Labelled,
               batch_size: int, path: str) -> dict[str, Any]:
    """fp32 eager (`reference`) and the configuration (`candidate`) on every item of `data`."""
    import torch

    from autotune.model.batches import leaves

    start = time.perf_counter()
    both = ref_only = cand_only = neither = agree = 0
    for inputs, labels, real in data.batches(batch_size):
        with torch.no_grad():
            ref, out = leaves(reference(inputs))[0].float(), leaves(candidate(inputs))[0].float()
        if ref.dim() != 2:
            raise ApplyError(f"{evaldata.BAD_DATA} {path} has class labels, and the model's output is of shape "
                             f"{tuple(ref.shape)}, not [batch, classes]; labels judge a classifier")
        evaldata.check_labels(labels, int(ref.shape[1]), path)
        ref_right = (ref.argmax(-1) == labels)[:real]
        out_right = (out.argmax(-1) == labels)[:real]
        both += int((ref_right & out_right).sum())
        ref_only += int((ref_right & ~out_right).sum())
        cand_only += int((~ref_right & out_right).sum())
        neither += int((~ref_right & ~out_right).sum())
        agree += int((ref.argmax(-1) == out.argmax(-1))[:real].sum())
    return {"kind": "accuracy", "items": both + ref_only + cand_only + neither, "both_right": both,
            "reference_only_right": ref_only, "candidate_only_right": cand_only, "both_wrong": neither,
            "top1_agreement_items": agree, "eval_s": round(time.perf_counter() - start, 3)}


def language(reference: Callable[[Any], Any], candidate: Callable[[Any], Any] | None,
             windows: list[Any]) -> dict[str, Any]:
    """Perplexity, KL divergence and same-top share over `windows`: `reference` and `candidate` map
    token ids [1, window] to next-token logits [1, window, vocab]; `candidate` None is fp32 itself."""
    import torch

    start = time.perf_counter()
    nll_ref: list[float] = []
    nll_out: list[float] = []
    kl_mean: list[float] = []
    kl_all = []
    same = positions = 0
    for window in windows:
        tokens = window[None]
        half = tokens.shape[1] // 2
        targets = tokens[0, half + 1:]
        ref_logp = torch.log_softmax(reference(tokens)[0, half:-1].double(), dim=-1)
        out_logp = ref_logp if candidate is None else \
            torch.log_softmax(candidate(tokens)[0, half:-1].double(), dim=-1)
        if out_logp.shape != ref_logp.shape:
            raise ApplyError(f"the configuration's logits are of shape {tuple(out_logp.shape)}, fp32 eager's "
                             f"{tuple(ref_logp.shape)}")
        nll_ref.append(float(-ref_logp.gather(1, targets[:, None]).mean()))
        nll_out.append(float(-out_logp.gather(1, targets[:, None]).mean()))
        kl = (ref_logp.exp() * (ref_logp - out_logp)).sum(-1).clamp_min(0.0)
        kl_all.append(kl)
        kl_mean.append(float(kl.mean()))
        same += int((ref_logp.argmax(-1) == out_logp.argmax(-1)).sum())
        positions += int(kl.numel())
    every = torch.cat(kl_all)
    quantiles = torch.quantile(every, torch.tensor(KL_QUANTILES, dtype=every.dtype)).tolist()
    return {"kind": "perplexity", "windows": len(windows), "window_tokens": int(windows[0].shape[0]),
            "scored_per_window": int(windows[0].shape[0]) // 2 - 1,
            "nll_reference": nll_ref, "nll": nll_out, "kl_per_window": kl_mean,
            "kl_mean": float(every.mean()), "kl_max": float(every.max()),
            "kl_quantiles": {f"{q:g}": value for q, value in zip(KL_QUANTILES, quantiles, strict=True)},
            "same_top": same, "positions": positions, "eval_s": round(time.perf_counter() - start, 3)}


def evaluate(args: Any, built: Any) -> dict[str, Any]:
    """The configuration the child built (`built`: its forward, or for --task generate its
    `Generation`) judged on `args.eval_split` of `args.eval_data` beside fp32 eager, which is built
    again here from the same (seeded) source."""
    from autotune.child.sources import knobs_of, load_model
    from autotune.model import hf
    from autotune.model.batches import call

    default = knobs_of(args).is_default
    if args.eval_metric:
        return custom(args, built, default)
    if args.task == hf.GENERATE:
        from autotune.model.generate.pytorch import TorchGenerator

        reference = built.generator if default else \
            TorchGenerator(load_model(args.model, args.import_path, args.task), False, False)
        windows = evaldata.window_part(generation_windows(args, reference.model.config), args.eval_split)
        return language(reference.logits, None if default else built.generator.logits, windows)
    data = evaldata.load_labelled(args.eval_data, item_shape(args))
    evaldata.check_shape(data, item_shape(args), args.eval_data)
    data = data.part(args.eval_split)
    if default:
        return classifier(built, built, data, args.batch_size, args.eval_data)
    model = load_model(args.model, args.import_path, args.task)
    return classifier(lambda batch: call(model, batch), built, data, args.batch_size, args.eval_data)


def generation_windows(args: Any, config: Any) -> list[Any]:
    """Every window of the text (`evaldata.text_windows`) at the model's window length."""
    return evaldata.text_windows(args.eval_data, evaldata.tokenizer_of(args.model), evaldata.window_length(config))


def item_shape(args: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in args.item_shape.split("x"))


def custom(args: Any, built: Any, default: bool) -> dict[str, Any]:
    """`--eval MODULE:FUNCTION`: the user's function called with the configuration (as `autotune.apply`
    returns it: a forward, or for --task generate a generator) and the evaluation batches, then with
    fp32 eager and the same batches; each call must return a finite float."""
    from autotune.child.sources import knobs_of, load_model
    from autotune.model import hf
    from autotune.model.batches import call

    function = metric_function(args.eval_metric, args.eval_import_path)
    batches = evaluation_batches(args)
    start = time.perf_counter()
    if args.task == hf.GENERATE:
        from autotune.model.generate.pytorch import TorchGenerator

        candidate = built.generator
        reference = candidate if default else \
            TorchGenerator(load_model(args.model, args.import_path, args.task), False, False)
    else:
        candidate = built
        model = None if knobs_of(args).is_default else load_model(args.model, args.import_path, args.task)
        reference = candidate if model is None else (lambda batch: call(model, batch))
    value = metric_value(function, candidate, batches, args.eval_metric)
    fp32 = value if reference is candidate else metric_value(function, reference, batches, args.eval_metric)
    return {"kind": "custom", "metric": args.eval_metric, "direction": args.eval_direction, "value": value,
            "reference_value": fp32, "batches": len(batches), "eval_s": round(time.perf_counter() - start, 3)}


def metric_function(spec: str, import_path: str) -> Callable[..., Any]:
    import importlib
    import sys

    module_name, _, name = spec.partition(":")
    if import_path and import_path not in sys.path:
        sys.path.insert(0, import_path)
    try:
        function = getattr(importlib.import_module(module_name), name)
    except Exception as exc:
        raise ApplyError(f"--eval {spec} cannot be imported ({type(exc).__name__}: {exc}); run autotune from the "
                         f"folder that holds {module_name}") from None
    if not callable(function):
        raise ApplyError(f"--eval {spec} is not a function; give MODULE:FUNCTION")
    return function  # type: ignore[no-any-return]


def metric_value(function: Callable[..., Any], model: Any, batches: list[Any], spec: str) -> float:
    import math

    import torch

    try:
        with torch.no_grad():
            found = function(model, batches)
    except Exception as exc:
        raise ApplyError(f"--eval {spec} raised {type(exc).__name__}: {exc}; fix the metric function") from None
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not math.isfinite(float(found)):
        raise ApplyError(f"--eval {spec} returned {found!r}, not a finite number; return the metric as a float")
    return float(found)


def evaluation_batches(args: Any) -> list[Any]:
    """What the user's metric is called with: the split's (inputs, labels) batches of labelled data,
    its token windows [1, window] of a text, or nothing without --eval-data."""
    from autotune.model import hf

    if not args.eval_data:
        return []
    if args.task == hf.GENERATE:
        windows = generation_windows(args, hf.config_of(args.model))
        return [w[None] for w in evaldata.window_part(windows, args.eval_split)]
    data = evaldata.load_labelled(args.eval_data, item_shape(args)).part(args.eval_split)
    return [(inputs, labels) for inputs, labels, _ in data.batches(args.batch_size)]  # the last one filled up
