"""Sections for tests/course/test_gpu_report.py: one that fails, one that hangs, one that saves rows and then hangs
(targets "tests.gpu_report_helpers:...")."""

import time


def fails(ctx):
    raise AssertionError("planted failure")


def hangs(ctx):
    time.sleep(600)


def works(ctx):
    return dict(device=str(ctx.device), tiny=ctx.tiny)


def checkpoints_then_hangs(ctx):
    ctx.checkpoint(dict(summary_rows=[dict(notebook="15", what="forward", impl="measured before the hang")]))
    time.sleep(600)
