"""Run by Python at start-up in every process the tests start (tests/conftest.py puts this folder on
their PYTHONPATH): the tests' machine switch and record (machine_switch.py). Imports no torch."""

import machine_switch

machine_switch.install()
