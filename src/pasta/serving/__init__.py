"""Serving: an OpenAI-compatible endpoint over the decoder, with continuous batching (`python -m pasta.serve`).

Modules: server (the model, engine and app built from a composed config, and the socket); then, in the order a
request meets them: protocol (the OpenAI request and response schemas, pydantic), app
(the FastAPI routes and request checks), answers (a request through the engine and back as OpenAI's bodies and
server-sent events), errors (OpenAI's error body for every failure), requests (what the API hands the engine and
the events it gets back), scheduler (admission limits and the waiting queue, no model), engine (the one thread
that owns the model and turns the decoder's engine loop, `pasta.decoding.runner.engine_step`, with the scheduler's
admission), metrics (Prometheus: the step loop's timing record, and what the cost model prices steps from). Serving
uses `pasta.decoding` and nothing of training or evaluation.
"""
