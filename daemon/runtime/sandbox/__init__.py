"""The sandbox a workflow run executes in (`python -I -m daemon.runtime.sandbox`): its
entry (`entry`, run by `__main__`) and the kernel confinement it applies to itself
before user code."""
