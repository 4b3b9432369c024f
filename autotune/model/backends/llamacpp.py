"""llama.cpp, through llama-cpp-python: a peer for `--task generate` alone. The model's
`save_pretrained` folder is converted to GGUF (F32, BF16, or quantized by llama.cpp's own quantizer
to Q8_0 for int8_weight_only and Q4_0 for int4_weight_only) and generated with by
`autotune.model.generate.llamacpp`; it runs no other task, so it needs nothing to run a model
(`packages`), has no artifact of the encoders' kind and no kernel in the probe: its trials measure it."""

from __future__ import annotations

from autotune.model.backends.base import Backend, Generation, Packages
from autotune.model.knobdefs import KnobValue, Precision


class LlamaCpp(Backend):
    name = "llamacpp"
    runtime = "llama.cpp"
    label = "llama.cpp"
    summary = ("--task generate only: llama.cpp (llama-cpp-python) on a GGUF converted from the model; "
               "int8_weight_only = Q8_0, int4_weight_only = Q4_0")
    precisions: tuple[Precision, ...] = ()
    generates: tuple[Precision, ...] = ("fp32", "bf16", "int8_weight_only", "int4_weight_only")
    generation = Generation("autotune.model.generate.llamacpp", Packages(
        "llama.cpp", "llamacpp", ("llama-cpp-python", "gguf"), ("llama_cpp", "gguf")))

    def generation_recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """llama-bench's usual comparison: Q4_0 and Q8_0 with a thread per physical core."""
        return (("llama.cpp-Q4_0", {"backend": "llamacpp", "precision": "int4_weight_only", "omp_threads": cores}),
                ("llama.cpp-Q8_0", {"backend": "llamacpp", "precision": "int8_weight_only", "omp_threads": cores}))

    def probe_ops(self, precision: Precision) -> tuple[str, ...]:
        return ()


LLAMACPP: Backend = LlamaCpp()
