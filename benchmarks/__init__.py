"""scratchformer's benchmark suite: our model against torch.nn and Hugging Face, interleaved in one
process. Run ``python -m benchmarks.run --help``."""
