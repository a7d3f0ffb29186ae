"""`specgen bench --endpoint`: the load tester of OpenAI-compatible servers (any, specgen's own included).

client: the HTTP/1.1 streaming client (llhttp frames each response; every event's arrival time);
measure: one endpoint's requests and what each stream measured;
load: concurrency and rate levels, their schedules and records;
spec_sources: the speculation figures each server kind reports (its /metrics, its response fields).
"""
