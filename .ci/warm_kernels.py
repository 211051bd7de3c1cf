"""Compile every Warp kernel of newtonipc_nb once, so that the tests and long runs find them in the kernel cache
(WARP_CACHE_PATH) instead of compiling in the middle of a first step. Prints the modules whose kernels it loaded."""
import importlib
import pkgutil
import sys

import warp as wp

import newtonipc_nb


def warm_kernels(device=None) -> list[str]:
    "Import every module of the package and load its Warp kernels on `device`; returns the module names."
    loaded = []
    for info in pkgutil.walk_packages(newtonipc_nb.__path__, "newtonipc_nb."):
        if "._" in info.name: continue
        mod = importlib.import_module(info.name)
        # a kernel imported from another module (the solver's from the line search) is that module's to load
        if any(isinstance(v, wp.Kernel) and v.module.name == info.name for v in vars(mod).values()):
            wp.load_module(mod, device=device)
            loaded.append(info.name.removeprefix("newtonipc_nb."))
    return loaded


if __name__ == "__main__":
    print(", ".join(warm_kernels(sys.argv[1] if len(sys.argv) > 1 else None)))
