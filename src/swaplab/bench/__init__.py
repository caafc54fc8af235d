"""`swaplab bench`: throughput, prefill and prefix-cache measured by an honest protocol (warm-up
discarded, repetitions, exact lengths, failures counted apart), stored in the results store."""
