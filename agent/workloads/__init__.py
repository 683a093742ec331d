"""Workloads the agent runs besides containers: the model cache and inference endpoint servers.

Here: model downloads into the node's cache (`models`) and vLLM OpenAI-compatible servers
(`endpoints`). Container engines are `agent.executors`; Ray is `agent.ray`.
"""
