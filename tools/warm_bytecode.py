#!/usr/bin/env python3
"""Write the bytecode (.pyc) of what the pipeline and its tests import, once per install (tools/setup.sh).

With PYTHONDONTWRITEBYTECODE=1 (set on many machines) Python never writes .pyc files, and every process
compiles torch, transformers and pandas again: seconds per job. Byte-compiling all of site-packages
(``compileall``) fixes that but compiles some 16,000 files of which the pipeline imports about 3,500 (most of
transformers' 400 model families, sympy's and scipy's unused parts): half a minute on 2 cores. Importing what the
pipeline uses, with bytecode writing on, compiles exactly those. A module left out here still works; it is only
compiled in memory by each process that imports it.

    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python tools/warm_bytecode.py [torch|rest]
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

#: Imported by the jobs, Snakemake and the tests beyond what importing verbmirage's own modules pulls in, in
#: two groups that share little, so that tools/setup.sh can warm them in two processes at once.
GROUPS = {
    "torch": ("torch", "transformers", "transformers.generation.utils", "transformers.modeling_utils",
              "transformers.processing_utils", "transformers.image_processing_utils",
              "transformers.tokenization_utils_fast", "peft", "accelerate", "safetensors.torch",
              "verbmirage.models", "verbmirage.variants", "verbmirage.inference"),
    "rest": ("pandas", "pyarrow.parquet", "numpy", "scipy.stats", "sklearn.metrics", "PIL.Image",
             "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "av", "yaml", "jsonschema", "tqdm", "matplotlib.pyplot",
             "matplotlib.backends.backend_agg", "matplotlib.backends.backend_pdf", "matplotlib.backends.backend_svg",
             "fontTools.subset", "snakemake", "snakemake.api", "snakemake.cli", "snakemake.report",
             "snakemake_executor_plugin_slurm", "docutils.core", "pytest", "xdist", "playwright.sync_api",
             "importlinter", "verbmirage.core", "verbmirage.data", "verbmirage.benchmark", "verbmirage.evaluation",
             "verbmirage.analysis", "verbmirage.workflow"),
}
#: The transformers model families the backends' own classes build on (their language models and vision towers;
#: their modules load lazily). The backends' own classes are warmed through their registry rows' ``preload`` names.
TRANSFORMERS_FAMILIES = ("auto", "llama", "blip_2", "qwen2", "bert", "siglip", "t5")


def names_of(group: str) -> list[str]:
    """The modules of ``group``: its list, each listed package of verbmirage with all its modules, and for the
    torch group the transformers families' modelling, processing and configuration modules."""
    names = []
    for name in GROUPS[group]:
        names.append(name)
        if name.startswith("verbmirage."):
            package = importlib.import_module(name)
            names += [info.name for info in pkgutil.walk_packages(package.__path__, f"{name}.")]
    if group == "torch":
        for family in TRANSFORMERS_FAMILIES:
            names += [f"transformers.models.{family}", *(f"transformers.models.{family}.{part}_{family}"
                                                         for part in ("modeling", "processing", "configuration"))]
    return names


def warm(group: str) -> list[str]:
    """Import every module of ``group``; the names that could not be imported (not installed, or a family
    without that part: nothing to compile)."""
    failed = []
    for name in names_of(group):
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
    if group == "torch" and "transformers" in sys.modules:
        from verbmirage.models.registry import preload_names

        for attribute in preload_names():  # touching a lazily loaded class imports its modules
            try:
                getattr(sys.modules["transformers"], attribute)
            except Exception:
                failed.append(f"transformers.{attribute}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", metavar="GROUP", help=f"{' or '.join(GROUPS)} (default: both, one "
                        "after the other)")
    args = parser.parse_args(argv)
    unknown = [group for group in args.groups if group not in GROUPS]
    if unknown:
        parser.error(f"unknown group {', '.join(unknown)}: choose from {', '.join(GROUPS)}")
    if sys.flags.dont_write_bytecode:
        print("warm_bytecode: bytecode writing is off (unset PYTHONDONTWRITEBYTECODE): nothing written",
              file=sys.stderr)
        return 1
    for group in args.groups or GROUPS:
        warm(group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
