"""4. The execution: a matrix's runs as jobs (plan.py, jobs.py), each in a fresh process, on
this machine or a Ray cluster (executors.py), scheduled by the driver (schedule.py), with
finished jobs kept in a work folder (workdir.py).
"""
