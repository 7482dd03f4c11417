import faulthandler, sys, subprocess
faulthandler.enable()
import numpy as np
cases = {
 "torch_cpu_int32": "import torch; a=torch.arange(10,dtype=torch.int32); print(_ext.compare(a,a.clone(),'uint32','exact')['pass'])",
 "numpy_model": "a=np.arange(10,dtype=np.uint32); print(_ext.model('00_roofline/copy/v0_scalar',[a],[a.copy()]))",
 "numpy_dlpack_capsule": "a=np.arange(10,dtype=np.uint32); print(_ext.compare(a.__dlpack__(),a.copy().__dlpack__(),'uint32','exact')['pass'])",
 "numpy_f32": "a=np.arange(10,dtype=np.float32); print(_ext.compare(a,a.copy(),'float32','exact')['pass'])",
 "numpy_2d": "a=np.arange(10,dtype=np.uint32).reshape(2,5); print(_ext.compare(a,a.copy(),'uint32','exact')['pass'])",
}
for name, code in cases.items():
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", "import numpy as np\nfrom lkw import _ext\n" + code], capture_output=True, text=True)
    print(name, "rc", p.returncode, p.stdout.strip()[-200:], p.stderr.strip()[-300:].replace("\n", " | "), flush=True)
