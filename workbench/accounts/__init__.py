"""Who may have an account and how hard one may be guessed at: the sign-up policy, invite codes, and
the throttles on signing in and signing up."""
