/**
 * TensorBoard's messages to iframe plugins. The tab announces itself the way TensorBoard's plugin
 * library does (`experimental.bootstrap` with a MessagePort); TensorBoard then tells it when the
 * user presses reload, or its periodic reload fires (`experimental.DataReloaded`).
 */

const BOOTSTRAP = 'experimental.bootstrap';
const DATA_RELOADED = 'experimental.DataReloaded';

interface Message {
  type: string;
  id: number;
  isReply: boolean;
}

export function onTensorBoardReload(listener: () => void): void {
  if (window.parent === window) return;
  const channel = new MessageChannel();
  channel.port1.onmessage = (event: MessageEvent<string>) => {
    const message = JSON.parse(event.data) as Message;
    if (message.isReply) return;
    if (message.type === DATA_RELOADED) listener();
    // TensorBoard waits for every plugin to answer a broadcast.
    channel.port1.postMessage(
      JSON.stringify({ type: message.type, id: message.id, payload: null, error: null, isReply: true }),
    );
  };
  window.parent.postMessage(BOOTSTRAP, window.location.origin, [channel.port2]);
}
