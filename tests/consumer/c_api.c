/* SPDX-License-Identifier: Apache-2.0 */
/* Uses an installed kiln from C: calls with no tensors are refused with a message, no GPU
 * needed. */
#include <kiln/kiln.h>
#include <stdio.h>

/* Whether `status` is the refusal of a call with no tensors, said in a message. */
static int refused(const char* call, kiln_status status) {
  const char* message = kiln_last_error();
  printf("%s with no tensors: status %d: %s\n", call, (int)status, message);
  return status == KILN_ERROR_INVALID_ARGUMENT && message != NULL && message[0] != '\0';
}

int main(void) {
  kiln_attention_options options;
  kiln_attention_options_init(&options);
  kiln_attention_grad_options grads;
  kiln_attention_grad_options_init(&grads);
  const int forward =
      refused("kiln_attention", kiln_attention(NULL, NULL, NULL, NULL, &options, NULL, NULL));
  const int backward = refused("kiln_attention_backward",
                               kiln_attention_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                       NULL, &options, NULL, &grads, NULL));
  return forward && backward ? 0 : 1;
}
