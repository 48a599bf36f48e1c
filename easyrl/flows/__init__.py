"""The execution flows: for each, the loop an actor runs and the loop a learner runs.

`async_replay` (DQN/Ape-X, IMPALA, DDPG/TD3, SAC, offline learners), `sync_rounds` (PPO, ES)
and `actor_gradients` (A3C) each hold what their loops do; the roles (`easyrl.roles`) own
the process plumbing the loops call (clients, communication threads, queues, reports).
"""
