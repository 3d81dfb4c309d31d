"""The ToolScale synthesis pipeline (`orchestrax synth`): domains, tasks, evolved tasks, and the
filter that keeps only tasks whose gold actions execute and pass the three checks."""
