import numpy as np
from lkw import _ext
a = np.arange(10, dtype=np.uint32)
b = a.copy()
print(_ext.compare(a.ctypes.data, b.ctypes.data, 10, "uint32", "exact"), flush=True)
