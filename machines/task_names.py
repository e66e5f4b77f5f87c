"""The names of the Celery tasks the machines app offers: string constants only, importing nothing."""
RECONCILE_MACHINES = "machines.tasks.reconcile_machines"
ADVANCE_MACHINE = "machines.tasks.advance_machine"
POWER_MACHINE = "machines.tasks.power_machine"
