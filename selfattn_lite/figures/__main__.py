import sys

from . import make_all

for path in make_all(sys.argv[1] if len(sys.argv) > 1 else "figures"):
    print(path)
