import torch, flashlab, itertools
import flashlab.attention as A
from flashlab import reference_gradients, rel_error
torch.manual_seed(0)
def case(dtype, Nq, Nk, D, cfg):
    A._backward_config = lambda d, i: cfg
    q=torch.randn(1,2,Nq,D,device="cuda",dtype=dtype,requires_grad=True); k,v=[torch.randn(1,2,Nk,D,device="cuda",dtype=dtype,requires_grad=True) for _ in range(2)]
    o=A.attention(q,k,v); do=torch.randn_like(o); o.backward(do)
    r=reference_gradients(q,k,v,do)
    return [round(rel_error(a,b),4) for a,b in zip((q.grad,k.grad,v.grad),r)]
for dtype in (torch.float16, torch.bfloat16):
  for (Nq,Nk) in [(40,257),(64,256),(1000,1000)]:
    for bm,bn,st in [(32,64,2),(32,64,1),(64,64,2),(16,64,2)]:
      print(dtype, Nq, Nk, (bm,bn,st), case(dtype,Nq,Nk,128,{"BLOCK_M":bm,"BLOCK_N":bn,"num_warps":4,"num_stages":st}), flush=True)
