"""Jobs: commands run on the fleet's nodes through Temporal.

- `spec.py`: what an operator asks for, checked (`job run`'s body).
- `limits.py`: the resource limits a job asks for each attempt, and what a node says it
  applied; standard library only, so the command line parses sizes with it too.
- `store/`: the rows operators list and show (jobs, attempts, output), a package of its
  concerns (its `__init__.py` is the map): the records and their reads, creating a job,
  cancelling one, the sweeper's claims, what became of nodes, the activities' writes, output,
  and what the edge reads of a node's attempts.
- `end_reasons.py`: why an attempt ended (EndReason: the strings rows and workflow
  histories hold), and which of those move it; standard library only.
- `placement.py`: which node runs an attempt, recorded as it is chosen; or why none can.
- `workflow/`: the job's workflow, run by every server's job worker; it picks where each
  attempt runs and moves it off a node that is blocked, purged or silent. A package of its
  concerns (its `__init__.py` is the map): the values that cross its boundary, one
  attempt as an activity or streamed, one node, every node, batches.
- `activities.py`: the workflow's steps that touch the database, run by the same workers.
- `parts.py`: attempts as rows sent over their node's control stream (issue 41): the
  message placement writes, what an edge reads to send, a node's report as the part's end,
  and what the sweeper tells workflows (ends not signalled, nodes fallen silent).
- `secret_env.py`: jobs' secret values, sealed at rest with the master key and sealed again
  to the placed node's key for each attempt; deleted when the job ends.
- `schedules.py`: schedules' rows and specs (a job run on a cron or an interval), and a
  run's job, made once; `schedule_calls.py`: their Temporal Schedules, in the tenant's
  namespace; `scheduled.py`: the workflow each run starts (it makes the job and runs the
  job's workflow as its child); `schedule_steps.py`: its database step.
- `role.py`: the job role every server runs, on Trio: the sweeper that starts workflows,
  sends cancellations and tells workflows of nodes taken away, and the portal to
  `worker_loop.py`: its Temporal client and workers (one per tenant namespace), on the
  portal's asyncio loop.

Above this layer (tests/test_layers.py): the management API's `/api/v1/jobs` routes are
`oz0/server/api/jobs.py` (schedules': `oz0/server/api/schedules.py`), and the edge's
side of the output nodes send over their control streams is `oz0/server/edge/job_output.py`.

The node's side (the attempt activity and its process) is in `oz0_node/jobs/`.

Also here:

- `follow.py`: a long poll of a job's output: read a page, and when it is empty and the job
  goes on, wait for the job's next notification (store.tell_followers) and read once more.
- `grant.py`: attempt grants: what the server that places an attempt signs so that its node
  runs it (oz0_common/attempt_grant.py has the format; docs/node-protocol.md, "Signed
  attempts").
- `heard.py`: the job workflow's check of its attempts that no node has been heard of yet
  (workflow.JobInput.watch_heard): an attempt Temporal counted started but dropped on the
  way to its node.
- `inputs.py`: what a job's workflow is started with (workflow.JobInput), from its row: the
  sweeper (role.JobsRole) and a schedule's run (schedule_steps.py) start jobs the same way.
- `pruner.py`: deleting what the cluster keeps no longer: each tenant's finished jobs
  (succeeded, failed, lost, cancelled; never queued or running) whose end is older than its
  job retention, with their attempts.
- `schedule_owners.py`: whose name a schedule's runs start jobs in, and the pause that waits
  for an admin.
- `spec_text.py`: a job's spec as an operator types it (`job run`'s options, the web UI's
  run form): durations and KEY=VALUE pairs.
"""
