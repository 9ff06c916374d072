"""How close simulated answers are to real ones: the metrics and the report (:mod:`.metrics`), the pairs scored (:mod:`.pairs`).

``stabletoolbench-mirror fidelity`` (:mod:`stabletoolbench_mirror.commands.fidelity`) is the command line.
"""
