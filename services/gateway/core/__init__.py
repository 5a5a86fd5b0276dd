"""The gateway's pure logic: OpenAI shapes, translation to llmbus messages, errors, the chunk contract."""
