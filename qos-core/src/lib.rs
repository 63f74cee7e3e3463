//! Pure QoS policies: every state machine takes `now` as an argument.
