"""``python -m selfattn_lite.course.figures [OUT]``: every figure of the notebooks' markdown, as PNGs in OUT."""

import argparse

from . import make_all

parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.figures",
                                 description="Draw every figure of the notebooks' markdown (PNGs).")
parser.add_argument("out", nargs="?", default="figures", help="folder to write them to (default: figures)")
for path in make_all(parser.parse_args().out):
    print(path)
