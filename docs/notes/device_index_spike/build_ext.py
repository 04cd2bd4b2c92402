import os, sys, time
import torch.utils.cpp_extension as ce
here = os.path.dirname(os.path.abspath(__file__))
build = os.path.join(here, "build_cache")
os.makedirs(build, exist_ok=True)
t = time.time()
mod = ce.load(name="tpu_devidx", sources=[os.path.join(here, "ext", "tpu_devidx.cpp")],
              build_directory=build, extra_cflags=["-O2"], verbose=True)
print("load() took %.1f s" % (time.time() - t), mod)
