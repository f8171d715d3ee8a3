"""The tests mirror the package: tests/core/ for src/scratchformer/core/, and so on; tests/scripts/
checks scripts/ and benchmarks/; the tests here check the repository as a whole (layout, style,
docs). This file's folder is on sys.path (pytest puts a conftest.py's folder there), so every test
imports the shared ``helpers`` module."""
