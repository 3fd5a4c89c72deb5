"""Registers the pipeline's sub-commands: ``produce``, ``consume``, ``ingest``, ``gateway``."""

from __future__ import annotations

import argparse

from worker.pipeline import gateway, ingest, records


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    records.register(commands)
    ingest.register(commands)
    gateway.register(commands)
