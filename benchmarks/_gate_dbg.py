import os, sys, traceback
from taxes.kernels.runtime import launch
def job(ctx):
    import tempfile
    info = {"gate": ctx._gate is not None, "shm": os.path.isdir("/dev/shm"), "shm_w": os.access("/dev/shm", os.W_OK)}
    try:
        from taxes.kernels.rank import StartGate
        fd, p = StartGate.create(2, None if ctx.rank == 0 else "/tmp"); info["create"] = p
        g = StartGate(fd, ctx.rank, 2); os.close(fd); os.unlink(p); info["map"] = "ok"
    except Exception as e:
        info["err"] = traceback.format_exc()[-800:]
    return info
if __name__ == "__main__":
    print(launch(job, 2, backend="cuda", timeout_s=120))
