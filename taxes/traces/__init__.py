"""Reading: Kineto traces, CUPTI records and our own runs into one timeline per rank; steps, collectives and which activities are communication."""
