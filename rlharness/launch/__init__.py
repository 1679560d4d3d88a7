"""Building a run and running it: the launcher (local, Ray, Slurm through submitit), the build of
its components, the checks before any work starts (preflight), resume's override text, the run lock,
evaluate.py's logic, and submitit's requeue and job errors."""
