"""The scripts that produced the data under ``results/``: GPU sessions (benchmark sweeps,
kernel resources, trainer measurements, the capstone's long runs) and one CPU tool (the
sm_90 register report). Each is a module run from the repository root, with no PYTHONPATH:

    python -m measurements.kernel_resources_aot            # registers/spills for sm_90, on any CPU
    python -m measurements.targets_table results/h200/attention.json
    bash measurements/next_gpu_session.sh bench OUT bfloat16

They write where they are told (an OUT argument); the committed results keep their paths
under results/, which the notebooks read through `flashlab.bench.records`. They are maintainer
tools of this repository, not part of the installed flashlab package.
"""
