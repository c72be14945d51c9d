/*
 * test_backward.h -- the backward-kernel checks of the standalone C harness
 * (test_backward.c), run from test_kernels.c's main after the forward cases.
 */
#ifndef TEST_BACKWARD_H
#define TEST_BACKWARD_H

/*
 * Runs every backward case, prints one line per case, and adds the number of
 * passed and failed cases to *passed and *failed.
 */
void run_backward_tests(int *passed, int *failed);

#endif /* TEST_BACKWARD_H */
