"""Engine: requests, scheduler, model runner, sampler, and the LLM facade.

request.py, scheduler.py and llm.py import no tensor library; llm.py selects the runtime from the
config before it imports model_runner.py and sampler.py (which do).
"""
