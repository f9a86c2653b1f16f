"""Engine: the LLM facade, the engine core that steps scheduler and runner, the output processor,
the tokenizer and stop strings.

No module here imports a tensor library; llm.py selects the runtime from the config before it
builds the model runner (which does).
"""
